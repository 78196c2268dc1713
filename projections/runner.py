"""One slice range of one projection, processed by one worker: read, validate, handle, commit.

The offset transaction first locks this worker's leases of the slices it writes (FOR SHARE) and
checks owner and epoch, so a worker that lost a slice can never commit for it; then it runs the
handler (exactly-once and grouped kinds) and inserts the offset rows. A failing batch is rolled
back and retried with backoff; then the projection's :class:`~projections.recovery.HandlerRecovery`
acts: stop (HandlerFailed), or isolate the poisoned event and skip or dead-letter it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import ExitStack
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from journal import tracing
from journal.envelope import EventEnvelope
from journal.errors import EventsMissing, HandlerFailed, LeaseLost
from journal.offsets import TimestampOffset
from journal.serialization import SerializerRegistry
from journal.settings import ProjectionSettings, QueryMode
from journal.waits import within

from . import range_context
from .dead_letter_store import DeadLetter, DeadLetterSql, sealed
from .handlers import Mode
from .outage import Outage
from .postgres_store import HEARTBEAT_PID, OffsetRow, ProjectionSql
from .read_ahead import ReadAhead
from .recovery import Failures, HandlerRecovery
from .stats import Stats
from .transactions import Connections, TransactionRunner, Unit
from .validation import Validator, Verdict

log = logging.getLogger("projections.runner")
T = TypeVar("T")
Rows = Any
"""The offset rows of a processor's kind: ``list[OffsetRow]`` for slices (here), ``{pid: (seq_nr,
TimeUUID)}`` for a tag (:mod:`.tag_runner`). The isolation of poisoned events works on either."""


class EventSource(Protocol):
    """What the runner needs of a journal (the slice-query contract)."""

    def events_by_slices(
        self, entity_type: str, min_slice: int, max_slice: int, offset: Any = None, *, heartbeats: bool = False
    ) -> AsyncIterator[EventEnvelope]: ...

    async def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None: ...

    def current_events_by_persistence_id(
        self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
    ) -> AsyncIterator[EventEnvelope]: ...


_END = object()


def _consume(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("reader ended with %r", task.exception())


class RangeProcessor:
    """Processes slices ``lo..hi`` while it holds their leases at ``epochs``."""

    def __init__(
        self,
        *,
        journal: EventSource,
        connections: Connections,
        sql: ProjectionSql,
        settings: ProjectionSettings,
        name: str,
        entity_type: str,
        lo: int,
        hi: int,
        owner: str,
        epochs: dict[int, int],
        handler: Callable[..., Awaitable[None]],
        mode: Mode,
        stats: Stats,
        query_mode: QueryMode = "horizon",
        outage: Outage | None = None,
        recovery: HandlerRecovery | None = None,
        serializers: SerializerRegistry | None = None,
    ) -> None:
        self.journal = journal
        self.serializers = serializers
        """The journal's: a dead letter's error and traceback are sealed with the event's subject's
        key when it encrypts (:mod:`journal.sealed_text`)."""
        self.sql = sql
        self.s = settings
        self.name = name
        self.entity_type = entity_type
        self.lo, self.hi = lo, hi
        self.key = self._unit_key()
        self.owner = owner
        self.epochs = dict(epochs)
        self.handler = handler
        self.mode = mode
        self.stats = stats
        self.query_mode = query_mode
        self.outage = outage or Outage(log, owner, quiet=settings.handler_max_backoff)
        self.recovery = recovery or HandlerRecovery.parse(None, settings)
        self._tries = self.recovery.tries(settings)
        self.dead_letters = DeadLetterSql(sql.schema)
        self.validator = Validator(timedelta(seconds=settings.offset_time_window))
        self._stopping = asyncio.Event()
        self.tx = TransactionRunner(
            connections, Unit(name, owner, self.key), leases=sql.leases, settings=settings, outage=self.outage,
            stats=stats, stopping=self._stopping, serializers=serializers,
        )  # fmt: skip
        """Every transaction and read of the database of this processor (:mod:`.transactions`)."""
        self._last_flush = time.monotonic()
        self._unflushed = 0
        self._pending_hb: dict[int, datetime] = {}
        """At-least-once: the heartbeat rows (slice -> timestamp) the next flush stores."""
        self._delivered_upto: datetime | None = None
        """Horizon mode: every event of the range below it is delivered and committed."""

    def _unit_key(self) -> str:
        """The processor's unit of work as stored and logged: its slice range."""
        return f"{self.lo}-{self.hi}"

    def stop(self) -> None:
        """Ask to stop after the current batch (committed, or rolled back if it cannot commit)."""
        self._stopping.set()

    # -- main loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        range_context.enter(range_context.OwnedRange(self.name, self.lo, self.hi, self.owner))
        slices = list(range(self.lo, self.hi + 1))
        window = timedelta(seconds=self.s.offset_time_window)

        async def load() -> dict[int, tuple[datetime, list[tuple[str, int, datetime]]]]:
            async with self.tx.pool.acquire() as conn:
                return await self.sql.load_offsets(conn, self.name, slices, window)

        loaded = await self.tx.read("loading offsets", load)
        for s in slices:
            latest, rows = loaded.get(s, (None, []))
            self.validator.load_slice(s, latest, rows)
        start = self.validator.start_timestamp(range(self.lo, self.hi + 1))
        offset = TimestampOffset(start) if start is not None else None
        log.info("%s %s: starting at %s", self.name, self.key, start or "the beginning")
        queue: ReadAhead[Any] = ReadAhead(self.s.queue_size)
        reader = asyncio.create_task(self._read(offset, queue))
        try:
            while not self._stopping.is_set():
                batch = await self._next_batch(queue, reader)
                if batch:
                    await self._process(batch)
                elif self.mode == "at-least-once" and self.validator.pending:
                    await self._maybe_flush(force=False)
            if self.mode == "at-least-once" and self.validator.pending:
                await self._maybe_flush(force=True)
            else:
                await self._settle_on_stop()
        finally:
            # never let a reader that is slow to unwind (a query being cancelled) hold up the
            # hand-over of these slices: it finishes in the background
            reader.add_done_callback(_consume)
            reader.cancel()

    async def _read(self, offset: TimestampOffset | None, queue: ReadAhead[Any]) -> None:
        try:
            async for env in self.journal.events_by_slices(self.entity_type, self.lo, self.hi, offset, heartbeats=True):
                await queue.put(env)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            await queue.put(e)
            return
        await queue.put(_END)

    async def _next_batch(self, queue: ReadAhead[Any], reader: asyncio.Task[None]) -> list[EventEnvelope]:
        size = 1 if self.mode == "exactly-once" else self.s.group_size
        batch: list[EventEnvelope] = []
        deadline: float | None = None
        while len(batch) < size:
            if queue.empty():  # only then is the clock read: items already read ahead are free
                if batch:
                    assert deadline is not None
                    timeout = deadline - time.monotonic()
                    if timeout <= 0:
                        break
                else:
                    timeout = 0.2
                try:
                    item = await within(queue.get(), timeout)
                except TimeoutError:
                    break
            else:
                item = queue.get_nowait()
            if item is _END:
                self._stopping.set()
                break
            if isinstance(item, BaseException):
                raise item
            batch.append(item)
            if item.source == "heartbeat":
                break
            if deadline is None:
                deadline = time.monotonic() + self.s.group_max_wait
            if self._stopping.is_set():
                break
        return batch

    # -- one batch ---------------------------------------------------------------------------

    async def _process(self, batch: list[EventEnvelope]) -> None:
        accepted: list[EventEnvelope] = []
        heartbeat: datetime | None = None
        v, per_pid = self.validator, self.query_mode == "backtracking"
        for env in batch:
            if env.source == "heartbeat":
                assert isinstance(env.offset, TimestampOffset)
                heartbeat = env.offset.timestamp
                continue
            if v.check(env, per_pid=per_pid).verdict is Verdict.ACCEPT:  # the common case, inline
                accepted.append(self._loaded(env))
                v.record(env)
                continue
            await self._validate_into(env, accepted)
        # Idle slices of the range may advance their stored offset (keeps restarts and rebalances
        # short) to a point below which every event of the range is delivered. The query's own
        # heartbeat says so in both modes. A delivered event's timestamp says so only in horizon
        # mode (delivery ordered by db_timestamp); in backtracking mode an older event may still
        # commit late and be found by backtracking, and a heartbeat row above it would make a new
        # owner resume past it (lost).
        upto = heartbeat
        if upto is None and self.query_mode == "horizon":
            upto = max((e.db_timestamp for e in batch if e.source != "heartbeat"), default=None)
        hb_slices = self._heartbeat_slices(upto) if upto is not None else {}
        if heartbeat is not None and not accepted:
            self.stats.caught_up(self.key, heartbeat)
        if self.mode == "at-least-once":
            for env in accepted:

                async def once(_conn: Any, env: EventEnvelope = env) -> None:
                    await self.handler(env)

                failures = Failures()
                try:
                    await self.tx.run(
                        once if not tracing.ON else self._traced(once, [env]), tries=self._tries,
                        transactional=False, failures=failures,
                    )  # fmt: skip
                except HandlerFailed:
                    if not self.recovery.isolates:
                        raise
                    await self._park(env, failures, [])  # its offset goes with the next flush
            self._unflushed += len(accepted)
            self._pending_hb.update(hb_slices)
            await self._maybe_flush(force=False)
            return
        if accepted or hb_slices:
            await self._commit(accepted, hb_slices)
        if upto is not None and self.query_mode == "horizon":
            self._delivered_upto = upto

    async def _settle_on_stop(self) -> None:
        """Horizon mode, when the range is handed over or stopped: store the position delivered
        and committed so far for every slice of the range (heartbeat rows, the rule ``_process``
        applies to idle slices, without waiting ``heartbeat_offset_interval``). The next owner of
        any of these slices then resumes there, not at the oldest offset among them, which made
        it re-read (and skip as duplicates) most of what was processed since."""
        upto = self._delivered_upto
        if upto is None or self.validator.pending:
            return
        hb: dict[int, datetime] = {}
        for s in range(self.lo, self.hi + 1):
            st = self.validator.slices.get(s)
            if st is None or st.latest is None or st.latest < upto:
                hb[s] = upto
        if not hb:
            return
        try:
            await self._commit([], hb)
        except (LeaseLost, HandlerFailed) as e:  # a slice already moved on: its owner resumes as before
            log.debug("%s %s: position not stored at stop: %s", self.name, self.key, e)

    def _heartbeat_slices(self, ts: datetime) -> dict[int, datetime]:
        every = timedelta(seconds=self.s.heartbeat_offset_interval)
        out: dict[int, datetime] = {}
        for s in range(self.lo, self.hi + 1):
            st = self.validator.slices.get(s)
            if st is None or st.latest is None or st.latest < ts - every:
                out[s] = ts
        return out

    async def _validate_into(self, env: EventEnvelope, accepted: list[EventEnvelope]) -> None:
        v = self.validator
        per_pid = self.query_mode == "backtracking"
        check = v.check(env, per_pid=per_pid)
        if check.verdict is Verdict.UNKNOWN:

            async def load() -> tuple[int, datetime] | None:
                async with self.tx.pool.acquire() as conn:
                    return await self.sql.load_pid(conn, self.name, env.slice, env.persistence_id)

            stored = await self.tx.read("loading a pid's offset", load)
            if stored is not None:
                v.learn(env.slice, env.persistence_id, *stored)
                check = v.check(env, per_pid=per_pid)
            elif per_pid:
                await self._accept_unrecorded(env, accepted)
                return
            else:
                await self._replay_unknown(env, accepted)
                return
        if check.verdict is Verdict.DUPLICATE:
            self.stats.duplicates += 1
            return
        if check.verdict is Verdict.GAP:
            await self._replay(env.persistence_id, check.gap_from, env.seq_nr - 1, accepted)
        accepted.append(self._loaded(env))
        v.record(env)

    def _loaded(self, env: EventEnvelope) -> EventEnvelope:
        return env  # envelopes of the slice query carry their payload in horizon mode

    async def _replay(self, pid: str, first: int, last: int, accepted: list[EventEnvelope]) -> None:
        """Fill a gap by persistence id; fail loudly if the journal lacks the events."""

        async def read() -> list[EventEnvelope]:
            return [e async for e in self.journal.current_events_by_persistence_id(pid, first, last)]

        got = await self.tx.read("replaying a gap", read)
        if [e.seq_nr for e in got] != list(range(first, last + 1)):
            raise EventsMissing(pid, first, last, f"needed by projection {self.name!r} (have {len(got)})")
        log.info("%s: replayed %s #%d..%d to fill a gap", self.name, pid, first, last)
        self.stats.replayed += len(got)
        for e in got:
            accepted.append(e)
            self.validator.record(e)

    async def _replay_unknown(self, env: EventEnvelope, accepted: list[EventEnvelope]) -> None:
        """Horizon mode, a pid with no stored offset: its earlier events not covered by the slice
        offset first (delivery is ordered, so the slice offset covers what was processed)."""
        v = self.validator

        async def read() -> list[EventEnvelope]:
            return [
                e
                async for e in self.journal.current_events_by_persistence_id(env.persistence_id, 1, env.seq_nr - 1)
                if not v.covered_by_slice(e.slice, e.db_timestamp, e.persistence_id, e.seq_nr)
            ]

        earlier = await self.tx.read("replaying a pid", read)
        self._accept_all(earlier, accepted)
        self.stats.replayed += len(earlier)
        self._accept_all([env], accepted)

    async def _accept_unrecorded(self, env: EventEnvelope, accepted: list[EventEnvelope]) -> None:
        """Backtracking mode, a pid with no record in the store (the reference's rule): seq_nr 1
        is new; a later one is accepted when its previous event is older than the time window
        (its record was evicted), otherwise the pid's events within the window are replayed first.
        The slice offset is no evidence: a late commit can lie below it and be unprocessed."""
        v = self.validator
        if env.seq_nr > 1:
            start = v.window_start(env.slice)
            prev = await self.tx.read(
                "a timestamp", lambda: self.journal.timestamp_of(env.persistence_id, env.seq_nr - 1)
            )
            if prev is not None and (start is None or prev >= start):

                async def read() -> list[EventEnvelope]:
                    return [
                        e
                        async for e in self.journal.current_events_by_persistence_id(
                            env.persistence_id, 1, env.seq_nr - 1
                        )
                        if start is None or e.db_timestamp >= start
                    ]

                earlier = await self.tx.read("replaying a pid", read)
                pid = env.persistence_id
                log.info("%s: replayed %d events of %s before #%d", self.name, len(earlier), pid, env.seq_nr)
                self._accept_all(earlier, accepted)
                self.stats.replayed += len(earlier)
        self._accept_all([env], accepted)

    def _accept_all(self, envs: list[EventEnvelope], accepted: list[EventEnvelope]) -> None:
        for e in envs:
            accepted.append(e)
            self.validator.record(e)

    # -- transactions ------------------------------------------------------------------------

    def _offset_rows(self, hb_slices: dict[int, datetime]) -> list[OffsetRow]:
        rows = [OffsetRow(s, pid, n, ts) for pid, (s, n, ts) in self.validator.pending.items()]
        rows += [OffsetRow(s, HEARTBEAT_PID, 0, ts) for s, ts in hb_slices.items()]
        return rows

    async def _commit(self, accepted: Sequence[EventEnvelope], hb_slices: dict[int, datetime]) -> None:
        rows = self._offset_rows(hb_slices)
        started = time.monotonic()
        parked = 0
        try:
            if accepted and self.recovery.isolates:
                parked = await self._commit_isolating(accepted, rows)
            else:
                await self._commit_rows(accepted, rows, self._tries)
        except BaseException:
            self.validator.rollback()
            raise
        self.validator.commit(hb_slices)
        newest = max((e.db_timestamp for e in accepted), default=None)
        self.stats.committed(len(accepted) - parked, newest, time.monotonic() - started, key=self.key)

    async def _commit_rows(
        self, envs: Sequence[EventEnvelope], rows: Rows, attempts: int, failures: Failures | None = None
    ) -> None:
        """One transaction: the handler on ``envs`` and the offset ``rows``."""

        async def body(conn: Any) -> None:
            if envs and self.mode == "grouped":
                await self.handler(conn, envs)
            else:
                for env in envs:
                    await self.handler(conn, env)
            await self._store(conn, rows)

        await self.tx.run(
            body if not tracing.ON else self._traced(body, envs), tries=attempts, fence=self._fence(rows),
            committed=self._proven_by(rows), failures=failures,
        )  # fmt: skip

    # -- the offset rows of this kind of processor (a tag processor has its own) ----------

    async def _store(self, conn: Any, rows: Rows) -> None:
        """Store offset rows in the transaction on ``conn``."""
        await self.sql.save_offsets(conn, self.name, self.key, rows)

    def _fence(self, rows: Rows, env: EventEnvelope | None = None) -> dict[int, int]:
        """The leases (slice -> epoch) a transaction storing ``rows`` (for ``env``) must hold."""
        touched = {r.slice: self.epochs[r.slice] for r in rows}
        if not touched and env is not None:
            touched[env.slice] = self.epochs[env.slice]
        return touched

    def _rest(self, rows: Rows) -> Rows:
        """What of a batch's rows is left to store once its events were committed or set aside
        half by half (the heartbeat rows)."""
        return [r for r in rows if r.persistence_id == HEARTBEAT_PID]

    def _traced(
        self, body: Callable[[Any], Awaitable[None]], envs: Sequence[EventEnvelope]
    ) -> Callable[[Any], Awaitable[None]]:
        """``body`` in a ``projection.batch`` span linked to the writes of ``envs``, with one
        ``projection.handle`` span per envelope that carries its write's trace context, a child
        of that context: one trace from the command that wrote an event to its read model."""

        async def traced(conn: Any) -> None:
            origins = [(e, tracing.context_of(e)) for e in envs]
            links = [tracing.link_to(ctx) for _, ctx in origins if ctx is not None]
            attributes = {"projection": self.name, "slices": self.key, "events": len(envs)}
            with tracing.span("projection.batch", links=links, attributes=attributes) as batch, ExitStack() as spans:
                for e, ctx in origins:
                    if ctx is not None:
                        spans.enter_context(
                            tracing.span(
                                "projection.handle", parent=ctx, kind="CONSUMER", links=[tracing.link_to(batch)],
                                attributes={"projection": self.name, "persistence_id": e.persistence_id,
                                            "seq_nr": e.seq_nr},
                            )
                        )  # fmt: skip
                await body(conn)

        return traced

    def _proven_by(self, rows: Rows) -> Callable[[Any], Awaitable[bool]]:
        """Did a transaction that stores ``rows`` commit? (asked when its COMMIT got no answer)"""
        proof = next((r for r in rows if r.persistence_id != HEARTBEAT_PID), None)

        async def committed(conn: Any) -> bool:
            return proof is not None and await self.sql.offset_row_exists(conn, self.name, proof)

        return committed

    def _rows_of(self, envs: Sequence[EventEnvelope]) -> Rows:
        latest: dict[str, EventEnvelope] = {}
        for e in envs:
            latest[e.persistence_id] = e
        return [OffsetRow(e.slice, pid, e.seq_nr, e.db_timestamp) for pid, e in latest.items()]

    async def _commit_isolating(self, accepted: Sequence[EventEnvelope], rows: Rows) -> int:
        """``retry-and-skip`` / ``retry-and-dead-letter``: the batch as one transaction; when it
        fails, halves committed on their own until the poisoned events are alone, each retried
        and then set aside. Returns how many were set aside."""
        whole = Failures()
        try:
            await self._commit_rows(accepted, rows, 1 if len(accepted) > 1 else self._tries, whole)
            return 0
        except HandlerFailed:
            if len(accepted) == 1:
                await self._park(accepted[0], whole, rows)
                return 1
        parked = await self._bisect(accepted)
        rest = self._rest(rows)
        if rest:
            await self._commit_rows([], rest, self._tries)
        return parked

    async def _bisect(self, envs: Sequence[EventEnvelope]) -> int:
        if len(envs) == 1:
            failures = Failures()
            try:
                await self._commit_rows(envs, self._rows_of(envs), self._tries, failures)
                return 0
            except HandlerFailed:
                await self._park(envs[0], failures, self._rows_of(envs))
                return 1
        parked = 0
        mid = len(envs) // 2
        for half in (envs[:mid], envs[mid:]):
            try:
                await self._commit_rows(half, self._rows_of(half), 1)
                continue
            except HandlerFailed:
                pass
            # outside the except block: the handler's errors below are not chained to this
            # HandlerFailed (a dead letter's traceback held the chain once per level)
            parked += await self._bisect(half)
        return parked

    async def _park(self, env: EventEnvelope, failures: Failures, rows: Rows) -> None:
        """Set a poisoned event aside: its dead letter (``retry-and-dead-letter``) and the offset
        ``rows`` that move past it, in one transaction."""
        dead = self.recovery.kind == "retry-and-dead-letter"
        first, last = failures.first, failures.last
        assert first is not None and last is not None
        error, tb = failures.message, failures.traceback
        if dead and self.serializers is not None:
            error, tb = await sealed(self.serializers, env.persistence_id, error, tb)
        letter = DeadLetter(
            self.name, env.persistence_id, env.seq_nr, env.slice, env.db_timestamp, error, tb, failures.attempts,
            first, last, self.key,
        )  # fmt: skip

        async def body(conn: Any) -> None:
            if dead:
                await self.dead_letters.park(conn, letter)
            await self._store(conn, rows)

        await self.tx.run(body, tries=self._tries, fence=self._fence(rows, env), committed=self._proven_by(rows))
        if dead:
            self.stats.dead_lettered += 1
        else:
            self.stats.skipped += 1
        log.warning(
            "%s %s: %s %s #%d after %d attempts: %s", self.name, self.key,
            "dead-lettered" if dead else "skipped", env.persistence_id, env.seq_nr, failures.attempts,
            failures.message,
        )  # fmt: skip

    async def _maybe_flush(self, *, force: bool) -> None:
        hb = self._pending_hb
        due = self._unflushed >= self.s.at_least_once_every or (
            time.monotonic() - self._last_flush >= self.s.at_least_once_interval
        )
        if not (force or due) or not (self.validator.pending or hb):
            return
        rows = self._offset_rows(hb)
        touched = {r.slice: self.epochs[r.slice] for r in rows}

        async def body(conn: Any) -> None:
            await self.sql.save_offsets(conn, self.name, self.key, rows)

        newest = max((ts for _, _, ts in self.validator.pending.values()), default=None)
        try:
            await self.tx.run(body, tries=self._tries, fence=touched)
        except BaseException:
            self.validator.rollback()
            raise
        self.validator.commit(hb)
        self._pending_hb = {}
        self.stats.committed(self._unflushed, newest, key=self.key)
        self._unflushed = 0
        self._last_flush = time.monotonic()
