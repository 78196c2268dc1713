"""The dead letters of a projection: list them, apply them again, or discard them (issue 26).

A retry applies each dead letter with the projection's (fixed) handler in one transaction that
also deletes the dead letter, so it is applied once even when two retries run at once. Dead
letters are applied in the events' order; when one fails again, the later ones of the same
persistence id wait (they are not applied before it).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from journal.envelope import EventEnvelope
from journal.ids import entity_type_of, slice_for
from journal.journal import Journal
from journal.offsets import TimestampOffset
from journal.serialization import SerializerRegistry

from .dead_letter_store import DeadLetter, DeadLetterSql, sealed
from .handlers import Mode
from .recovery import Failures


class Superseded(NamedTuple):
    """A state projection's dead letter whose pid has a later revision now (``revision``)."""

    revision: int


class EventLoader(Protocol):
    """What a retry needs of a journal: one event with its payload (``Journal.load_envelope``),
    and its serializers (a dead letter that fails again is sealed as the runner seals it).
    A state projection's letters are loaded by :class:`StateLoader`."""

    serializers: SerializerRegistry

    async def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope | Superseded | None: ...


class StateLoader:
    """The dead letters of a state projection (``--states``): a letter is the pid's state at its
    revision, read from the durable state store; when the pid has a later revision now, the
    letter is superseded (that revision is, or will be, delivered as any change, and applying
    the older one after it would take the read model backwards)."""

    def __init__(self, journal: Journal, sql: DeadLetterSql) -> None:
        self.states = journal.durable_state()
        self.serializers = journal.serializers
        self.sql = sql

    async def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope | Superseded | None:
        state = await self.states.get(persistence_id)
        if state is None or state.revision < seq_nr:  # hard deleted (and maybe written again)
            return None
        if state.revision > seq_nr:
            return Superseded(state.revision)
        pid, ts = state.persistence_id, state.db_timestamp
        offset = TimestampOffset(ts, {pid: state.revision})
        return EventEnvelope(
            pid, entity_type_of(pid), slice_for(pid), state.revision, ts, state.value, offset,
            tags=state.tags, has_payload=not state.deleted, source="dead letter",
        )  # fmt: skip

    async def still_current(self, conn: Any, letter: DeadLetter) -> bool:
        """In the retry's transaction: the pid's state is still at the letter's revision, and
        stays so until the commit (its row held FOR SHARE: an upsert of the pid waits, so the
        projection cannot deliver a later revision before this one). A row this database does
        not hold (a partitioned journal's) is not checked."""
        found = await self.sql.state_revision(conn, letter.persistence_id)
        return found is None or found == letter.seq_nr


@dataclass
class RetryResult:
    applied: list[DeadLetter] = field(default_factory=list)
    failed: list[tuple[DeadLetter, str]] = field(default_factory=list)
    """Dead letters whose handler failed again (kept, their attempts counted), with the error."""
    waiting: list[DeadLetter] = field(default_factory=list)
    """Later dead letters of a persistence id whose earlier one failed again (not tried)."""
    missing: list[DeadLetter] = field(default_factory=list)
    """Dead letters whose event is no longer in the journal (deleted): kept; discard them."""
    superseded: list[tuple[DeadLetter, int]] = field(default_factory=list)
    """A state projection's dead letters whose pid has a later revision (with it): taken, not applied."""
    gone: int = 0
    """Dead letters another retry or a discard took first (not applied here)."""


async def retry(
    journal: EventLoader, conn: Any, sql: DeadLetterSql, name: str, handler: Callable[..., Awaitable[None]],
    mode: Mode, *, persistence_id: str | None = None, seq_nr: int | None = None,
    still_current: Callable[[Any, DeadLetter], Awaitable[bool]] | None = None,
) -> RetryResult:  # fmt: skip
    """Apply the dead letters of ``name`` (or of one pid, or one event) with ``handler``.
    ``still_current`` (a state projection's, :meth:`StateLoader.still_current`) is asked in
    each letter's transaction before it is applied; False: the letter is left for the next retry."""
    out = RetryResult()
    blocked: set[str] = set()
    for letter in await sql.letters(conn, name):
        pid = letter.persistence_id
        if (persistence_id is not None and pid != persistence_id) or (seq_nr is not None and letter.seq_nr != seq_nr):
            continue
        if pid in blocked:
            out.waiting.append(letter)
            continue
        env = await journal.load_envelope(pid, letter.seq_nr)
        if env is None:
            out.missing.append(letter)
            blocked.add(pid)
            continue
        if isinstance(env, Superseded):
            async with conn.transaction():
                if await sql.take(conn, name, pid, letter.seq_nr):
                    out.superseded.append((letter, env.revision))
            continue
        failures = Failures()
        try:
            took = await _apply(conn, sql, name, letter, env, handler, mode, still_current)
        except Exception as e:
            failures.failed(e)
            error, tb = await sealed(journal.serializers, pid, failures.message, failures.traceback)
            await sql.failed_again(conn, name, pid, letter.seq_nr, error, tb)
            out.failed.append((letter, failures.message))
            blocked.add(pid)
            continue
        if took:
            out.applied.append(letter)
        else:
            out.gone += 1
    return out


async def _apply(
    conn: Any, sql: DeadLetterSql, name: str, letter: DeadLetter, env: EventEnvelope,
    handler: Callable[..., Awaitable[None]], mode: Mode,
    still_current: Callable[[Any, DeadLetter], Awaitable[bool]] | None,
) -> bool:  # fmt: skip
    if mode == "at-least-once":  # no transaction of the handler's: it runs, then the letter goes
        await handler(env)
        async with conn.transaction():
            return await sql.take(conn, name, letter.persistence_id, letter.seq_nr)
    async with conn.transaction():
        if still_current is not None and not await still_current(conn, letter):
            return False
        if not await sql.take(conn, name, letter.persistence_id, letter.seq_nr):
            return False
        if mode == "grouped":
            await handler(conn, [env])
        else:
            await handler(conn, env)
        return True


def letters_json(letters: list[DeadLetter]) -> str:
    """``projections dead-letters list --json``: one object per dead letter, times in ISO 8601."""

    def default(value: Any) -> Any:
        if isinstance(value, datetime):
            return value.isoformat()
        raise TypeError(f"not JSON: {type(value).__name__}")

    return json.dumps([asdict(d) for d in letters], default=default, indent=2)
