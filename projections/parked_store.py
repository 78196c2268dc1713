"""Every SQL statement of the parked events (``projection_parked_event``, issue 36): the later
events of a persistence id held behind its dead letter under ``retry-and-dead-letter-sequenced``.

A row names the event (pid, seq_nr, slice, timestamp), never its payload: the event stays in the
journal, as a dead letter's does, and the drain reads it from there. A row is inserted in the
offset transaction that moves past the event, and deleted in the transaction that applies it
when the dead letter ahead of it is retried or discarded (:mod:`.sequencing`).

A persistence id is *held* while it has a dead letter or a parked event. Whether it is held is
read, and a parked row inserted or deleted, under a transaction-scoped advisory lock of the
projection and pid (:meth:`ParkedSql.lock`), by the worker and by the drain alike: a drain that
finds nothing left and a worker that parks one more event never miss each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from journal.envelope import EventEnvelope
from journal.postgres import SchemaSql

from .dead_letter_store import take_event_row

LOCK_CLASS = 1460304
"""The first key of the parked events' advisory locks (the second: a hash of projection and pid)."""


@dataclass(frozen=True)
class ParkedEvent:
    """One event held behind a dead letter of its persistence id."""

    projection: str
    persistence_id: str
    seq_nr: int
    slice: int
    db_timestamp: datetime
    projection_key: str
    parked_at: datetime


_COLUMNS = "projection_name, persistence_id, seq_nr, slice, db_timestamp, projection_key, parked_at"


@dataclass(frozen=True)
class ParkedSql(SchemaSql):
    """Statements for one schema (functions take a connection: callers choose the transaction)."""

    @property
    def table(self) -> str:
        return self.t("projection_parked_event")

    @property
    def dead(self) -> str:
        return self.t("projection_dead_letter")

    async def lock(self, conn: Any, name: str, pid: str) -> None:
        """Inside a transaction: wait for, and hold until it ends, the lock of ``name``'s ``pid``."""
        await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2 || '/' || $3))", LOCK_CLASS, name, pid)

    async def held(self, conn: Any, name: str, pid: str) -> bool:
        """``pid`` has a dead letter or a parked event in ``name``: its next events are parked."""
        held: bool = await conn.fetchval(
            f"""SELECT EXISTS (SELECT 1 FROM {self.dead} WHERE projection_name = $1 AND persistence_id = $2)
OR EXISTS (SELECT 1 FROM {self.table} WHERE projection_name = $1 AND persistence_id = $2)""",
            name,
            pid,
        )
        return held

    async def held_pids(self, conn: Any, name: str) -> set[str]:
        """Every pid of ``name`` with a dead letter or a parked event (a processor's start)."""
        rows = await conn.fetch(
            f"""SELECT persistence_id FROM {self.dead} WHERE projection_name = $1
UNION SELECT persistence_id FROM {self.table} WHERE projection_name = $1""",
            name,
        )
        return {r[0] for r in rows}

    async def park(self, conn: Any, name: str, key: str, envs: Sequence[EventEnvelope]) -> None:
        """Park ``envs`` (one statement); an event parked again (an at-least-once redelivery) is
        kept once."""
        await conn.execute(
            f"""INSERT INTO {self.table} ({_COLUMNS})
SELECT $1, p, n, s, t, $2, clock_timestamp() FROM unnest($3::text[], $4::bigint[], $5::int[], $6::timestamptz[])
  AS e(p, n, s, t)
ON CONFLICT (projection_name, persistence_id, seq_nr) DO NOTHING""",
            name, key, [e.persistence_id for e in envs], [e.seq_nr for e in envs], [e.slice for e in envs],
            [e.db_timestamp for e in envs],
        )  # fmt: skip

    async def first(self, conn: Any, name: str, pid: str) -> ParkedEvent | None:
        """The parked event of ``pid`` with the lowest seq_nr, unless a dead letter of ``pid``
        lies before it (then that dead letter holds it: None)."""
        r = await conn.fetchrow(
            f"""SELECT {_COLUMNS} FROM {self.table} p WHERE projection_name = $1 AND persistence_id = $2
AND NOT EXISTS (SELECT 1 FROM {self.dead} d WHERE d.projection_name = $1 AND d.persistence_id = $2
  AND d.seq_nr < p.seq_nr)
ORDER BY seq_nr LIMIT 1""",
            name,
            pid,
        )
        if r is None:
            return None
        return ParkedEvent(
            r["projection_name"], r["persistence_id"], r["seq_nr"], r["slice"], r["db_timestamp"],
            r["projection_key"], r["parked_at"],
        )  # fmt: skip

    async def take(self, conn: Any, name: str, pid: str, seq_nr: int) -> bool:
        """Delete one parked event (True), or find it gone (False: another drain took it)."""
        return await take_event_row(conn, self.table, name, pid, seq_nr)

    async def unled(self, conn: Any, name: str, pid: str | None = None) -> list[str]:
        """Pids whose parked events have no dead letter ahead of them any more (a drain that was
        stopped half-way): the next retry or discard drains them. Oldest first."""
        rows = await conn.fetch(
            f"""SELECT persistence_id FROM {self.table} p WHERE projection_name = $1
AND ($2::text IS NULL OR persistence_id = $2)
GROUP BY persistence_id
HAVING NOT EXISTS (SELECT 1 FROM {self.dead} d WHERE d.projection_name = $1
  AND d.persistence_id = p.persistence_id AND d.seq_nr < min(p.seq_nr))
ORDER BY min(db_timestamp), persistence_id""",
            name,
            pid,
        )
        return [r[0] for r in rows]

    async def behind(self, conn: Any, name: str) -> dict[tuple[str, int], int]:
        """(pid, seq_nr) of each dead letter of ``name`` -> how many events are parked behind it
        (after it, before the pid's next dead letter); (pid, 0) for parked events no dead letter
        leads (a drain stopped half-way)."""
        rows = await conn.fetch(
            f"""SELECT p.persistence_id, coalesce(
  (SELECT max(d.seq_nr) FROM {self.dead} d WHERE d.projection_name = $1 AND d.persistence_id = p.persistence_id
   AND d.seq_nr < p.seq_nr), 0) AS ahead, count(*) AS n
FROM {self.table} p WHERE p.projection_name = $1 GROUP BY 1, 2""",
            name,
        )
        return {(r[0], r[1]): r[2] for r in rows}

    async def count(self, conn: Any, name: str, pid: str | None = None) -> int:
        n: int = await conn.fetchval(
            f"""SELECT count(*) FROM {self.table}
WHERE projection_name = $1 AND ($2::text IS NULL OR persistence_id = $2)""",
            name,
            pid,
        )
        return n
