"""One slice range of one projection, processed by one worker: read, validate, hand on.

A :class:`RangeProcessor` reads the slice query of its range (:mod:`.batches`: a reader task, a
read-ahead queue, batches), validates each envelope against the stored offsets
(:class:`~projections.validation.Validator`: duplicates dropped, a gap replayed from the
journal, an unknown pid looked up), and hands the accepted events with the heartbeats of its
idle slices to its delivery (:mod:`.delivery`: at-least-once, exactly-once or grouped, chosen
once when it is made). The delivery runs the handler and stores the range's offset rows
(:class:`~projections.offset_rows.SliceOffsetRows`) through the processor's transaction runner
(:mod:`.transactions`), whose first statement checks the leases, so a worker that lost a slice
never commits for it; a poisoned event is set aside by :mod:`.isolation`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any, Protocol

from journal.envelope import SNAPSHOT_SOURCE, EventEnvelope
from journal.errors import EventsMissing
from journal.offsets import TimestampOffset
from journal.settings import QueryMode

from . import range_context
from .batches import Batch, Batches, Reader, one_a_page, pages, process
from .offset_rows import SliceOffsetRows
from .parts import ProjectionParts
from .validation import Validator, Verdict

log = logging.getLogger("projections.runner")
_db_timestamp = attrgetter("db_timestamp")


class PageQuery(Protocol):
    """A source's slice query a page at a time (``Journal.event_pages_by_slices``)."""

    def __call__(
        self, entity_type: str, min_slice: int, max_slice: int, offset: Any = None, *, heartbeats: bool = False
    ) -> AsyncIterator[Sequence[EventEnvelope]]: ...


class EventSource(Protocol):
    """What the runner needs of a journal (the slice-query contract)."""

    def events_by_slices(
        self, entity_type: str, min_slice: int, max_slice: int, offset: Any = None, *, heartbeats: bool = False
    ) -> AsyncIterator[EventEnvelope]: ...

    async def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None: ...

    def current_events_by_persistence_id(
        self, persistence_id: str, from_seq_nr: int = 1, to_seq_nr: int | None = None
    ) -> AsyncIterator[EventEnvelope]: ...


class RangeProcessor:
    """Processes slices ``lo..hi`` while it holds their leases at ``epochs``."""

    def __init__(
        self, parts: ProjectionParts, *, entity_type: str, lo: int, hi: int, epochs: dict[int, int],
        query_mode: QueryMode = "horizon", pages: PageQuery | None = None, from_snapshots: bool = False,
    ) -> None:  # fmt: skip
        """``pages``: the journal's query a page at a time (without: ``events_by_slices``, one
        envelope a page). ``from_snapshots``: ``pages`` starts from snapshots, and a pid is judged
        by its own record, as in backtracking mode (an event the query left out always lies after
        its pid's snapshot there, so such a pid has a stored row; this rule does not rely on the
        slice offset for it)."""
        self.journal: EventSource = parts.journal
        self.pages = pages
        self.sql = parts.sql
        self.s = parts.settings
        self.name = parts.name
        self.owner = parts.owner
        self.entity_type = entity_type
        self.lo, self.hi = lo, hi
        self.key = f"{lo}-{hi}"
        """The processor's unit of work as stored and logged: its slice range."""
        self.stats = parts.stats
        self.query_mode = query_mode
        self.per_pid = query_mode == "backtracking" or from_snapshots
        """Judge an unknown pid by its own record, never by the slice offset (:meth:`_validate_into`)."""
        self.validator = self._validator(timedelta(seconds=self.s.offset_time_window))
        self._stopping = asyncio.Event()
        self.tx = parts.transactions(self.key, self._stopping)
        """Every transaction and read of the database of this processor (:mod:`.transactions`)."""
        self.offsets = SliceOffsetRows(
            self.sql, self.tx.unit, {s: epochs[s] for s in range(lo, hi + 1)}, self.validator
        )
        self.delivery = parts.delivery(self.tx, self.offsets)
        self._starts = parts.handler if isinstance(parts.handler, range_context.RangeStarts) else None
        self._heartbeat_every = timedelta(seconds=self.s.heartbeat_offset_interval)

    def stop(self) -> None:
        """Ask to stop after the current batch (committed, or rolled back if it cannot commit)."""
        self._stopping.set()

    async def run(self) -> None:
        owned = range_context.OwnedRange(self.name, self.lo, self.hi, self.owner)
        range_context.enter(owned)
        if self._starts is not None:
            self._starts.range_started(owned)
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
        batches = Batches(self.s.queue_size, self.delivery.batch_size, self.s.group_max_wait, self._stopping)

        await process(self._query(offset), batches, self._process, self.delivery)

    def _validator(self, window: timedelta) -> Validator:
        """How envelopes are admitted against the stored offsets (a state range's: by revision)."""
        return Validator(window)

    def _query(self, offset: TimestampOffset | None) -> Reader:
        """The range's live query from ``offset``, with heartbeats, a page at a time."""
        et, lo, hi, paged = self.entity_type, self.lo, self.hi, self.pages
        if paged is not None:
            return pages(lambda: paged(et, lo, hi, offset, heartbeats=True))
        return one_a_page(lambda: self.journal.events_by_slices(et, lo, hi, offset, heartbeats=True))

    async def _process(self, batch: Batch) -> None:
        """Validate a batch and hand what it accepts on, with the heartbeats of idle slices."""
        accepted: list[EventEnvelope] = []
        heartbeat: datetime | None = None
        v, per_pid = self.validator, self.per_pid
        i, n = 0, len(batch)
        while True:
            i = v.accept_next(batch, i, accepted, per_pid=per_pid)  # the common case, in one loop
            if i >= n:
                break
            env = batch[i]
            i += 1
            if env.source == "heartbeat":
                assert isinstance(env.offset, TimestampOffset)
                heartbeat = env.offset.timestamp
            else:
                await self._validate_into(env, accepted)
        # Idle slices of the range may advance their stored offset (keeps restarts and rebalances
        # short) to a point below which every event of the range is delivered. The query's own
        # heartbeat says so in both modes. A delivered event's timestamp says so only in horizon
        # mode (delivery ordered by db_timestamp); in backtracking mode an older event may still
        # commit late and be found by backtracking, and a heartbeat row above it would make a new
        # owner resume past it (lost).
        upto = heartbeat
        horizon = self.query_mode == "horizon"
        if upto is None and horizon:  # no heartbeat in the batch (one would be its last)
            upto = max(map(_db_timestamp, batch))
        hb_slices = self.offsets.heartbeats(upto, self._heartbeat_every) if upto is not None else {}
        if heartbeat is not None and not accepted:
            self.stats.caught_up(self.key, heartbeat)
        await self.delivery.deliver(accepted, hb_slices)
        if upto is not None and horizon:
            self.offsets.delivered_upto = upto

    async def _stored(self, env: EventEnvelope) -> tuple[int, datetime] | None:
        """The stored offset (seq_nr, timestamp) of ``env``'s pid, when memory does not have it."""

        async def load() -> tuple[int, datetime] | None:
            async with self.tx.pool.acquire() as conn:
                return await self.sql.load_pid(conn, self.name, env.slice, env.persistence_id)

        return await self.tx.read("loading a pid's offset", load)

    async def _validate_into(self, env: EventEnvelope, accepted: list[EventEnvelope]) -> None:
        v = self.validator
        per_pid = self.per_pid
        if env.source == SNAPSHOT_SOURCE:
            await self._admit_snapshot(env, accepted, per_pid)
            return
        check = v.check(env, per_pid=per_pid)
        if check.verdict is Verdict.UNKNOWN:
            stored = await self._stored(env)
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
        accepted.append(env)
        v.record(env)

    async def _admit_snapshot(self, env: EventEnvelope, accepted: list[EventEnvelope], per_pid: bool) -> None:
        """A snapshot (a range started from snapshots): processed unless the pid is past it."""
        v = self.validator
        if v.known_seq_nr(env.slice, env.persistence_id) is None:
            stored = await self._stored(env)
            if stored is not None:
                v.learn(env.slice, env.persistence_id, *stored)
        if v.admits_snapshot(env, per_pid=per_pid):
            accepted.append(env)
            v.record(env)
        else:
            self.stats.duplicates += 1

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
        The slice offset is no evidence: a late commit can lie below it and be unprocessed.
        From snapshots the same rule holds: an event left out for a snapshot always lies after
        that snapshot in the query (:mod:`journal.query.from_snapshots`), so its pid has a row."""
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
