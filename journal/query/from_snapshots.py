"""The slice query that starts from snapshots: each pid's latest snapshot, then only its events
after it; then live, exactly as ``events_by_slices``.

It is one ordered stream, like the slice query, read below a bound ``B`` taken when it starts
(the horizon, or now minus behind-current-time in backtracking mode), with the snapshots saved
before a cutoff ``C`` read then too (the database clock, or the start of a write to the snapshot
table still running: every such snapshot is visible to every page). Below ``B`` a pid's events
that its snapshot covers are left out, and the snapshot comes *at the place of the first event it
covers at or after the query's start* (that event's ``db_timestamp``, the offset there naming the
snapshot's seq_nr): so an event is only ever left out after its pid's snapshot was delivered, and
an offset stored after any envelope is never ahead of an event not yet delivered nor past an
event left out for a snapshot not yet delivered (the reference's first version placed snapshots
ahead of the events of other pids: r2dbc #717). Events of pids without a snapshot come as in the
slice query (the reference's first version started after the oldest snapshot and missed them).
What stays out:

- a snapshot that names an event not stored (beyond the pid's last event) covers nothing: the
  pid's events all come, as in a full read (the events are the truth, the snapshot a cache);
- a snapshot whose event lies at or above ``B`` covers nothing below ``B``;
- a snapshot saved at or after ``C`` (while the catch-up runs) covers nothing: a page reading it
  may lie past the place it would have had;
- a pid's snapshot whose own event was deleted (events deleted up to the snapshot) comes just
  before the pid's first stored event after it;
- a pid with a snapshot and no stored event at all: its snapshot comes first, before any event,
  with the offset the query started from (never ahead of anything).

Each page reads the snapshot table as it is then. A snapshot replaced or deleted while the
catch-up runs is no longer used from the next page on: its pid's later events come, the ones it
covered too (a consumer judges them by their sequence numbers: those at or below the snapshot it
got are duplicates). Whatever happens to it after a crash, its pid's left-out events lie after
the snapshot envelope, so a consumer that stored an offset past them had the snapshot.

From ``B`` on the query is ``events_by_slices`` from where the catch-up ended. Restarted from an
offset the catch-up delivered, it starts from snapshots again from there: a pid with an event its
snapshot covers after that offset gets the snapshot (again, or a newer one), which restates its
state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from datetime import datetime
from functools import partial
from typing import Any

from ..backend import SliceRange, SnapshotRow, SnapshotSlicePage, SnapshotSliceReads
from ..envelope import SNAPSHOT_SOURCE, EventEnvelope, page_envelopes
from ..errors import JournalUnavailable, SerializationError
from ..offsets import EPOCH, TimestampOffset
from ..serialization import SerializerRegistry
from ..settings import QueryMode
from .slice_query import SliceQueryState
from .slices import Page, SliceQueries

log = logging.getLogger("journal.query.from_snapshots")


class FromSnapshots:
    """The query over one journal's slice queries and the backend's snapshot slice reads."""

    def __init__(self, queries: SliceQueries, reads: SnapshotSliceReads) -> None:
        self.queries = queries
        self.reads = reads
        self.serializers: SerializerRegistry = queries.serializers
        self.q = queries.q

    def current(
        self, et: str, lo: int, hi: int, offset: TimestampOffset | None, mode: QueryMode
    ) -> AsyncIterator[EventEnvelope]:
        """Up to the bound taken when iteration starts, then end."""

        async def gen() -> AsyncIterator[EventEnvelope]:
            state = SliceQueryState(offset, self.q.buffer_size, self.q.catch_up_buffer_size)
            async for page in self._catch_up(state, et, lo, hi, mode, live=False):
                for env in page:
                    yield env

        return gen()

    async def live_pages(
        self, et: str, lo: int, hi: int, offset: TimestampOffset | None, mode: QueryMode, heartbeats: bool
    ) -> AsyncIterator[list[EventEnvelope]]:
        """The catch-up from snapshots, then the live slice query from where it ended."""
        state = SliceQueryState(offset, self.q.buffer_size, self.q.catch_up_buffer_size)
        async for page in self._catch_up(state, et, lo, hi, mode, live=True):
            yield page
        async for page in self.queries.live_pages(et, lo, hi, state.offset, mode, heartbeats, state=state):
            yield page

    async def _catch_up(
        self, state: SliceQueryState, et: str, lo: int, hi: int, mode: QueryMode, *, live: bool
    ) -> AsyncIterator[list[EventEnvelope]]:
        """Below a bound taken now: the snapshots of pids without events, then the pages
        (``live``: a read the database does not answer is retried, as the live query does)."""

        async def read(call: Callable[[], Any]) -> Any:
            return await (self._retrying(call) if live else call())

        bound = await read(lambda: self.queries.bound(mode))
        cutoff = await read(self.reads.snapshot_cutoff)
        start = state.offset
        start_ts, start_seen = (start.timestamp, start.seen) if start is not None else (None, {})
        slices = SliceRange(et, lo, hi)
        after = ""
        while True:
            only = await read(partial(self.reads.read_only_snapshots, slices, after, self.q.buffer_size))
            if not only:
                break
            after = only[-1].persistence_id
            yield await self._alone(only, start)
        log.info(
            "%s %d-%d: from snapshots saved before %s, below %s", et, lo, hi, cutoff.isoformat(), bound.isoformat()
        )
        if cutoff <= EPOCH:
            log.warning(
                "%s %d-%d: a write to the snapshot table whose start this role cannot see (pg_read_all_stats?): "
                "this catch-up uses no snapshot", et, lo, hi,
            )  # fmt: skip
        while True:
            state.behind = True  # below a bound fixed at the start: a backlog, catch-up pages
            req = state.request(bound)
            if req is None:
                return
            page = SnapshotSlicePage(req, bound, start_ts, start_seen, cutoff)
            rows = await read(partial(self.reads.read_snapshot_slice_rows, slices, page))
            envs = await self._envelopes(rows, state)
            state.accept_page(req, len(rows), rows[-1]["db_timestamp"] if rows else None, bound)
            if state.needs_probe:
                probe = partial(self.queries.backend.next_slice_timestamp, slices, state.probe_from, bound)
                found = await read(probe)
                state.skip_to(found if found is not None else bound)
            if envs:
                yield envs
            if state.caught_up:
                return

    async def _retrying(self, read: Callable[[], Any]) -> Any:
        """``read()``, retried with backoff while the database is unavailable (as the live query)."""
        failures = 0
        while True:
            self.queries._check_open()
            try:
                return await read()
            except JournalUnavailable as e:
                level = logging.WARNING if failures == 0 else logging.DEBUG
                log.log(level, "slice query from snapshots: %s; retrying with backoff", e)
                await asyncio.sleep(self.queries.settings.retry.backoff(failures))
                failures += 1

    async def _alone(self, rows: list[SnapshotRow], start: TimestampOffset | None) -> list[EventEnvelope]:
        """Snapshots of pids without events: at the place the query started (never ahead)."""
        offset = start if start is not None else TimestampOffset(EPOCH)
        _held = await self._keys((r.persistence_id, r.state.ser_id) for r in rows)
        out: list[EventEnvelope] = []
        for r in rows:
            pid, seq_nr, m = r.persistence_id, r.seq_nr, r.meta
            state = self._decode(pid, seq_nr, r.state.ser_id, r.state.manifest, r.state.payload)
            meta = self._meta(pid, seq_nr, m.ser_id, m.manifest, m.payload) if m is not None else None
            ts = offset.timestamp
            out.append(self._snapshot(pid, r.entity_type, r.slice, seq_nr, ts, offset, r.tags, state, meta))
        return out

    async def _envelopes(self, rows: list[Any], state: SliceQueryState) -> list[EventEnvelope]:
        """A page's envelopes in order, each with its offset (``state`` advances past the page).

        Events are the slice query's lazy envelopes of the page (decoded when asked for); a
        'replace' row's snapshot comes at the place of the event of the row (the first it covers
        since the query's start), a 'before' row's just before its event; either has the page's
        offset there with the snapshot's seq_nr seen."""
        keys = await self._keys(_subjects(rows))
        page = Page(rows, state.offset, self.serializers, keys)
        lazy = page_envelopes(rows, page, page.metadata)
        out: list[EventEnvelope] = []
        for i, r in enumerate(rows):
            kind = r["snap_kind"]
            if kind is None:
                out.append(lazy[i])
                continue
            pid, s, offset = r["persistence_id"], r["snap_seq_nr"], page.offset_at(i)
            offset = TimestampOffset.trusted(offset.timestamp, {**offset.seen, pid: s})
            out.append(self._snapshot(
                pid, r["entity_type"], r["slice"], s, r["db_timestamp"], offset, tuple(r["snap_tags"] or ()),
                self._decode(pid, s, r["snap_ser_id"], r["snap_ser_manifest"], r["snap_snapshot"]),
                self._meta(pid, s, r["snap_meta_ser_id"], r["snap_meta_ser_manifest"] or "", r["snap_meta_payload"])
                if r["snap_meta_ser_id"] is not None else None,
            ))  # fmt: skip
            if kind == "before":
                out.append(lazy[i])
        if rows:
            state.offset = page.offset_at(len(rows) - 1)
        return out

    async def _keys(self, rows: Iterable[tuple[str, int]]) -> Any:
        return await self.serializers.load_keys(rows) if self.serializers.keyed else ()

    def _decode(self, pid: str, seq_nr: int, ser_id: int, manifest: str, payload: bytes) -> Any:
        try:
            return self.serializers.deserialize(ser_id, manifest, bytes(payload), what="snapshot", pid=pid)
        except SerializationError as e:
            raise e.located(f"snapshot of {pid}#{seq_nr}") from e

    def _meta(self, pid: str, seq_nr: int, ser_id: int, manifest: str, payload: bytes | None) -> Any:
        try:
            return self.serializers.deserialize(ser_id, manifest, bytes(payload or b""), what="snapshot metadata")
        except SerializationError as e:
            raise e.located(f"snapshot of {pid}#{seq_nr}") from e

    @staticmethod
    def _snapshot(
        pid: str, et: str, slice_: int, seq_nr: int, ts: datetime, offset: TimestampOffset, tags: tuple[str, ...],
        state: Any, metadata: Any,
    ) -> EventEnvelope:  # fmt: skip
        return EventEnvelope(pid, et, slice_, seq_nr, ts, state, offset, tags, metadata, "", True, SNAPSHOT_SOURCE)


def _subjects(rows: list[Any]) -> Iterator[tuple[str, int]]:
    """(pid, serializer id) of every payload of a page from snapshots that is decoded."""
    for r in rows:
        kind = r["snap_kind"]
        if kind is not None:
            yield r["persistence_id"], r["snap_ser_id"]
        if kind != "replace":
            yield r["persistence_id"], r["event_ser_id"]
