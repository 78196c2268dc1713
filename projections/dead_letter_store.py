"""Every SQL statement of the dead-letter table (``projection_dead_letter``, issue 26), and the
sealing of its error and traceback when the journal encrypts (issue 32).

A dead letter is inserted in the offset transaction that moves past the event (so exactly-once
holds), and deleted in the transaction that applies it on retry (so it is applied once).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from journal.postgres import SchemaSql
from journal.sealed_text import open_texts, seal_texts
from journal.serialization import SerializerRegistry


@dataclass(frozen=True)
class DeadLetter:
    """One parked event of one projection: enough to run its handler on it again."""

    projection: str
    persistence_id: str
    seq_nr: int
    slice: int
    db_timestamp: datetime
    """The event's own timestamp: retries apply dead letters in this order."""
    error: str
    traceback: str
    attempts: int
    first_failure: datetime
    last_failure: datetime
    projection_key: str = ""


async def sealed(serializers: SerializerRegistry, pid: str, error: str, tb: str) -> tuple[str, str]:
    """A dead letter's error and traceback as stored: sealed with the key of the event's subject
    when the journal encrypts, so that forgetting the subject makes them unreadable too."""
    e, t = await seal_texts(serializers, pid, [error, tb], DEAD_LETTER_TEXT)
    return e, t


async def opened(serializers: SerializerRegistry, letters: list[DeadLetter]) -> list[DeadLetter]:
    """Dead letters with their error and traceback readable (sealed ones opened)."""
    out = []
    for d in letters:
        e, t = await open_texts(serializers, d.persistence_id, [d.error, d.traceback], DEAD_LETTER_TEXT)
        out.append(replace(d, error=e, traceback=t))
    return out


DEAD_LETTER_TEXT = "projection_dead_letter"
"""The kind of text bound to a sealed dead letter's error and traceback."""

_COLUMNS = (
    "projection_name, persistence_id, seq_nr, slice, db_timestamp, error, traceback, attempts, "
    "first_failure, last_failure, projection_key"
)


def _letter(r: Any) -> DeadLetter:
    return DeadLetter(
        r["projection_name"], r["persistence_id"], r["seq_nr"], r["slice"], r["db_timestamp"], r["error"],
        r["traceback"], r["attempts"], r["first_failure"], r["last_failure"], r["projection_key"],
    )  # fmt: skip


async def take_event_row(conn: Any, table: str, name: str, pid: str, seq_nr: int) -> bool:
    """Delete the row of one event of a projection from ``table`` (a dead letter, a parked
    event): True, or False when it was gone (another retry or drain took it first)."""
    status: str = await conn.execute(
        f"DELETE FROM {table} WHERE projection_name = $1 AND persistence_id = $2 AND seq_nr = $3", name, pid, seq_nr
    )
    return status.split()[-1] == "1"


@dataclass(frozen=True)
class DeadLetterSql(SchemaSql):
    """Statements for one schema (functions take a connection: callers choose the transaction)."""

    @property
    def table(self) -> str:
        return self.t("projection_dead_letter")

    async def park(self, conn: Any, letter: DeadLetter) -> None:
        """Insert a dead letter; the same event parked again (an at-least-once redelivery)
        counts its attempts on and keeps its first failure time."""
        await conn.execute(
            f"""INSERT INTO {self.table} ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
ON CONFLICT (projection_name, persistence_id, seq_nr) DO UPDATE SET error = EXCLUDED.error,
  traceback = EXCLUDED.traceback, attempts = {self.table}.attempts + EXCLUDED.attempts,
  last_failure = EXCLUDED.last_failure""",
            letter.projection, letter.persistence_id, letter.seq_nr, letter.slice, letter.db_timestamp,
            letter.error, letter.traceback, letter.attempts, letter.first_failure, letter.last_failure,
            letter.projection_key,
        )  # fmt: skip

    async def letters(self, conn: Any, name: str, limit: int | None = None) -> list[DeadLetter]:
        """A projection's dead letters in the order a retry applies them (event time, pid, seq_nr)."""
        rows = await conn.fetch(
            f"""SELECT {_COLUMNS} FROM {self.table} WHERE projection_name = $1
ORDER BY db_timestamp, persistence_id, seq_nr LIMIT $2""",
            name,
            limit,
        )
        return [_letter(r) for r in rows]

    async def take(self, conn: Any, name: str, pid: str, seq_nr: int) -> bool:
        """Inside the retry's transaction: delete the dead letter (True), or find it gone (False:
        another retry applied or discarded it). The row lock makes two retries apply it once."""
        return await take_event_row(conn, self.table, name, pid, seq_nr)

    async def failed_again(self, conn: Any, name: str, pid: str, seq_nr: int, error: str, tb: str) -> None:
        """A retry failed: count the attempt and keep its error."""
        await conn.execute(
            f"""UPDATE {self.table} SET attempts = attempts + 1, last_failure = clock_timestamp(), error = $4,
  traceback = $5 WHERE projection_name = $1 AND persistence_id = $2 AND seq_nr = $3""",
            name, pid, seq_nr, error, tb,
        )  # fmt: skip

    async def discard(self, conn: Any, name: str, pid: str | None, seq_nr: int | None) -> int:
        """Delete dead letters without applying them (all of the projection, or of one pid, or one)."""
        status: str = await conn.execute(
            f"""DELETE FROM {self.table} WHERE projection_name = $1 AND ($2::text IS NULL OR persistence_id = $2)
AND ($3::bigint IS NULL OR seq_nr = $3)""",
            name,
            pid,
            seq_nr,
        )
        return int(status.split()[-1])

    async def state_revision(self, conn: Any, pid: str) -> int | None:
        """Inside a state letter's retry transaction: the pid's revision here (None: no row in
        this database), its row held FOR SHARE until the commit (an upsert of it waits)."""
        found: int | None = await conn.fetchval(
            f"SELECT revision FROM {self.t('durable_state')} WHERE persistence_id = $1 FOR SHARE", pid
        )
        return found

    async def count(self, conn: Any, name: str) -> int:
        n: int = await conn.fetchval(f"SELECT count(*) FROM {self.table} WHERE projection_name = $1", name)
        return n

    async def names(self, conn: Any) -> list[str]:
        return [r[0] for r in await conn.fetch(f"SELECT DISTINCT projection_name FROM {self.table}")]
