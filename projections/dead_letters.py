"""The dead letters of a projection: list them, apply them again, or discard them (issue 26).

A retry applies each dead letter with the projection's (fixed) handler in one transaction that
also deletes the dead letter, so it is applied once even when two retries run at once. Dead
letters are applied in the events' order; when one fails again, the later ones of the same
persistence id wait (they are not applied before it).

Under ``retry-and-dead-letter-sequenced`` the later events of a dead letter's persistence id are
parked behind it (:mod:`.sequencing`). Once the dead letter is applied or discarded they are
drained (:func:`drain`): applied one by one in seq_nr order with the same handler and mode, each
in the transaction that deletes its row (at-least-once: the handler, then the delete), under the
pid's lock, until none is left; then the pid flows again. One that fails becomes the pid's dead
letter and the rest stay parked behind it. A drain stopped half-way (a kill) is finished by the
next retry or discard.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from journal.envelope import EventEnvelope
from journal.errors import InvalidArgument
from journal.ids import entity_type_of, slice_for
from journal.journal import Journal
from journal.offsets import TimestampOffset
from journal.serialization import SerializerRegistry

from .dead_letter_store import DeadLetter, DeadLetterSql, sealed
from .handlers import Mode
from .parked_store import ParkedEvent, ParkedSql
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
    drained: list[tuple[str, int]] = field(default_factory=list)
    """Parked events applied behind their dead letter (pid, seq_nr), in the order applied."""
    dropped: list[tuple[str, int]] = field(default_factory=list)
    """Parked events no longer in the journal (deleted): their rows dropped, the drain went on."""


async def retry(
    journal: EventLoader, conn: Any, sql: DeadLetterSql, name: str, handler: Callable[..., Awaitable[None]],
    mode: Mode, *, persistence_id: str | None = None, seq_nr: int | None = None,
    still_current: Callable[[Any, DeadLetter], Awaitable[bool]] | None = None,
) -> RetryResult:  # fmt: skip
    """Apply the dead letters of ``name`` (or of one pid, or one event) with ``handler``, each
    followed by the events parked behind it; then the parked events no dead letter leads.
    ``still_current`` (a state projection's, :meth:`StateLoader.still_current`) is asked in
    each letter's transaction before it is applied; False: the letter is left for the next retry."""
    out = RetryResult()
    parked = ParkedSql(sql.schema)
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
            await drain(journal, conn, parked, sql, name, pid, handler, mode, out)
        else:
            out.gone += 1
    for pid in await parked.unled(conn, name, persistence_id):
        await drain(journal, conn, parked, sql, name, pid, handler, mode, out)
    return out


async def discard(
    conn: Any, sql: DeadLetterSql, name: str, persistence_id: str | None, seq_nr: int | None,
    journal: EventLoader | None = None, handler: Callable[..., Awaitable[None]] | None = None,
    mode: Mode = "grouped",
) -> tuple[int, RetryResult]:  # fmt: skip
    """Delete dead letters without applying them (all of ``name``, of one pid, or one event);
    the events parked behind them are drained with ``handler`` (:func:`drain`). Without a handler,
    a pid with parked events is refused (InvalidArgument) and its dead letters are kept."""
    parked, out, n = ParkedSql(sql.schema), RetryResult(), 0
    pids = (
        [persistence_id]
        if persistence_id is not None
        else sorted({d.persistence_id for d in await sql.letters(conn, name)})
    )
    for pid in pids:
        async with conn.transaction():  # under the pid's lock: no event is parked behind it meanwhile
            await parked.lock(conn, name, pid)
            waiting = await parked.count(conn, name, pid)
            if waiting and (handler is None or journal is None):
                raise InvalidArgument(
                    f"{waiting} events of {pid} are parked behind its dead letters (retry-and-dead-letter-sequenced): "
                    f"give --handler (and --mode) to apply them in order once the dead letters are discarded"
                    + (f" ({n} dead letters of other persistence ids were discarded)" if n else "")
                )
            n += await sql.discard(conn, name, pid, seq_nr)
        if handler is not None and journal is not None:
            await drain(journal, conn, parked, sql, name, pid, handler, mode, out)
    if handler is not None and journal is not None:
        for pid in await parked.unled(conn, name, persistence_id):  # a drain stopped half-way before
            await drain(journal, conn, parked, sql, name, pid, handler, mode, out)
    return n, out


async def drain(
    journal: EventLoader, conn: Any, parked: ParkedSql, sql: DeadLetterSql, name: str, pid: str,
    handler: Callable[..., Awaitable[None]], mode: Mode, out: RetryResult,
) -> None:  # fmt: skip
    """Apply ``pid``'s parked events in seq_nr order until none is left (the pid flows again), a
    dead letter lies ahead of the next, or one fails (it becomes the pid's dead letter)."""
    step = _drain_one_at_least_once if mode == "at-least-once" else _drain_one
    while True:
        try:
            if not await step(journal, conn, parked, name, pid, handler, mode, out):
                return
        except _Failed as f:
            await _dead_lettered(journal, conn, parked, sql, f, out)
            return


async def _drain_one(
    journal: EventLoader, conn: Any, parked: ParkedSql, name: str, pid: str, handler: Callable[..., Awaitable[None]],
    mode: Mode, out: RetryResult,
) -> bool:  # fmt: skip
    """The next parked event applied and deleted in one transaction (False: none is next)."""
    async with conn.transaction():
        await parked.lock(conn, name, pid)
        event = await parked.first(conn, name, pid)
        if event is None:
            return False
        await parked.take(conn, name, pid, event.seq_nr)
        env = await journal.load_envelope(pid, event.seq_nr)
        if env is not None:
            try:
                await (handler(conn, [env]) if mode == "grouped" else handler(conn, env))
            except Exception as e:
                raise _Failed(event, e) from e
    (out.drained if env is not None else out.dropped).append((pid, event.seq_nr))
    return True


async def _drain_one_at_least_once(
    journal: EventLoader, conn: Any, parked: ParkedSql, name: str, pid: str, handler: Callable[..., Awaitable[None]],
    mode: Mode, out: RetryResult,
) -> bool:  # fmt: skip
    """At-least-once: the handler on the next parked event, then its row deleted (a drain
    stopped in between applies it again)."""
    event = await parked.first(conn, name, pid)
    if event is None:
        return False
    env = await journal.load_envelope(pid, event.seq_nr)
    if env is not None:
        try:
            await handler(env)
        except Exception as e:
            raise _Failed(event, e) from e
    async with conn.transaction():
        await parked.lock(conn, name, pid)
        await parked.take(conn, name, pid, event.seq_nr)
    (out.drained if env is not None else out.dropped).append((pid, event.seq_nr))
    return True


class _Failed(Exception):
    """The handler failed on a parked event (rolled back: the event is still parked)."""

    def __init__(self, event: ParkedEvent, error: Exception) -> None:
        super().__init__(f"{event.persistence_id} #{event.seq_nr}")
        self.event, self.error = event, error


async def _dead_lettered(
    journal: EventLoader, conn: Any, parked: ParkedSql, sql: DeadLetterSql, f: _Failed, out: RetryResult
) -> None:
    """A parked event the handler failed on becomes its pid's dead letter (the rest stay behind
    it), in one transaction under the pid's lock; unless another drain applied it meanwhile (its
    row is gone: the pid may be flowing again, and a dead letter now would not hold it)."""
    event, failures = f.event, Failures()
    failures.failed(f.error)
    pid = event.persistence_id
    error, tb = await sealed(journal.serializers, pid, failures.message, failures.traceback)
    first, last = failures.first, failures.last
    assert first is not None and last is not None
    letter = DeadLetter(
        event.projection, pid, event.seq_nr, event.slice, event.db_timestamp, error, tb, 1, first, last,
        event.projection_key,
    )  # fmt: skip
    async with conn.transaction():
        await parked.lock(conn, event.projection, pid)
        if not await parked.take(conn, event.projection, pid, event.seq_nr):
            return
        await sql.park(conn, letter)
    out.failed.append((letter, failures.message))


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


def letters_json(letters: list[DeadLetter], behind: dict[tuple[str, int], int] | None = None) -> str:
    """``projections dead-letters list --json``: one object per dead letter, times in ISO 8601,
    with ``parked``: how many events are parked behind it (``behind``: :meth:`ParkedSql.behind`)."""

    def default(value: Any) -> Any:
        if isinstance(value, datetime):
            return value.isoformat()
        raise TypeError(f"not JSON: {type(value).__name__}")

    held = behind or {}
    out = [{**asdict(d), "parked": held.get((d.persistence_id, d.seq_nr), 0)} for d in letters]
    return json.dumps(out, default=default, indent=2)
