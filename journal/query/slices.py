"""The thin async loops that drive the slice query state machines over a SliceQueryBackend.

``current`` reads up to a bound fixed at its start and ends; ``live`` never ends: it catches up to
a fresh bound, then waits for a notification, a poll interval (adaptive), or a heartbeat tick.
Transient failures are retried with backoff and the query resumes from its last delivered offset.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from .. import tracing
from ..backend import PageRequest, SliceQueryBackend, SliceRange, StoredEvent
from ..codec import KeysInUse
from ..conditions import Condition
from ..envelope import TRACE_MANIFEST, EventEnvelope, page_envelopes, with_trace
from ..errors import JournalUnavailable, SerializationError
from ..ids import MAX_SEQ_NR, entity_type_of, slice_for
from ..offsets import SequenceOffset as SeqOffset
from ..offsets import TimestampOffset
from ..serialization import JSON_SERIALIZER_ID, SerializerRegistry, stored_plain_json
from ..settings import JournalSettings, QueryMode
from ..waits import wait_set
from .backtracking import BacktrackingState
from .horizon import Horizon
from .notifications import NotificationHub, Subscription
from .pid_order import PidOrder
from .slice_query import SliceQueryState, poll_delay

log = logging.getLogger("journal.query.slices")


def envelope_of(
    r: StoredEvent, serializers: SerializerRegistry, offset: TimestampOffset | SeqOffset, source: str = "query"
) -> EventEnvelope:
    """A stored row as an envelope, its payload deserialized (the one decoder of StoredEvent;
    positional construction, no per-row string building). A payload-free row gives
    ``event=None``; an unreadable one a SerializationError naming ``pid#seq_nr``."""
    deserialize = serializers.deserialize
    try:
        pid = r.persistence_id
        event = deserialize(r.ser_id, r.ser_manifest, r.payload, pid=pid) if r.payload is not None else None
        m = r.meta
        traced = m is not None and m.manifest == TRACE_MANIFEST
        meta = deserialize(m.ser_id, m.manifest, m.payload, what="metadata") if m is not None and not traced else None
    except SerializationError as e:
        raise e.located(f"{r.persistence_id}#{r.seq_nr}") from e
    env = EventEnvelope(
        r.persistence_id, r.entity_type, r.slice, r.seq_nr, r.db_timestamp, event, offset,
        r.tags, meta, r.writer, r.payload is not None, source,
    )  # fmt: skip
    return with_trace(env, m.payload) if traced else env  # type: ignore[union-attr]


class SliceQueries:
    """Slice queries of one journal: shares one horizon and one notification listener."""

    def __init__(
        self,
        backend: SliceQueryBackend,
        settings: JournalSettings,
        serializers: SerializerRegistry,
    ) -> None:
        self.backend = backend
        self.settings = settings
        self.q = settings.query
        self.serializers = serializers
        self.horizon = Horizon(backend)
        self.hub = NotificationHub(backend)
        self.closed = False

    async def close(self) -> None:
        """Stop the listener; live queries still running end with JournalUnavailable."""
        self.closed = True
        self.hub.wake_all()
        await self.hub.close()

    def _check_open(self) -> None:
        if self.closed:
            raise JournalUnavailable("the journal was closed")

    async def bound(self, mode: QueryMode, fresh_after: float | None = None) -> datetime:
        """A safe upper bound (exclusive) for a data query run after this call returns."""
        if mode == "horizon":
            return await self.horizon.bound(fresh_after)
        now = await self.backend.db_now()
        return now - timedelta(seconds=self.q.behind_current_time)

    # -- envelopes ---------------------------------------------------------------------------

    def envelope(self, r: StoredEvent, offset: TimestampOffset | SeqOffset, source: str = "query") -> EventEnvelope:
        return envelope_of(r, self.serializers, offset, source)

    @staticmethod
    def heartbeat(entity_type: str, min_slice: int, offset: TimestampOffset) -> EventEnvelope:
        return EventEnvelope(
            persistence_id="",
            entity_type=entity_type,
            slice=min_slice,
            seq_nr=0,
            db_timestamp=offset.timestamp,
            event=None,
            offset=offset,
            has_payload=False,
            source="heartbeat",
        )

    # -- the loops ---------------------------------------------------------------------------

    async def _catch_up(
        self, state: SliceQueryState, bound: datetime | QueryMode, et: str, lo: int, hi: int
    ) -> AsyncIterator[EventEnvelope]:
        """:meth:`_catch_up_pages`, one envelope at a time."""
        async for page in self._catch_up_pages(state, bound, et, lo, hi):
            for env in page:
                yield env

    async def _catch_up_pages(
        self, state: SliceQueryState, bound: datetime | QueryMode, et: str, lo: int, hi: int
    ) -> AsyncIterator[list[EventEnvelope]]:
        """:meth:`_row_pages`, each page's envelopes (a non-empty list, the consumer's to keep)."""
        async for page in self._row_pages(state, bound, et, lo, hi):
            yield page_envelopes(page.rows, page, page.metadata)

    async def _row_pages(
        self, state: SliceQueryState, bound: datetime | QueryMode, et: str, lo: int, hi: int
    ) -> AsyncIterator[_Page]:
        """Read pages until everything below ``bound`` is delivered; yield each non-empty page
        (its rows, the offset before it, and the keys its payloads need, held while it is).

        The next page is fetched while the current one is handed out (the state knows where the
        next page starts once the current page's offsets are computed), so the database and the
        decoding overlap. A failed fetch surfaces only after the previous page was delivered.
        """
        b = self.backend
        if not isinstance(bound, datetime):  # a mode: take the bound now (current queries)
            bound = await self.bound(bound)
        slices = SliceRange(et, lo, hi)

        def read(req: PageRequest) -> asyncio.Task[list[Any]]:
            rows = b.read_slice_rows(slices, req)
            t = asyncio.ensure_future(rows if not tracing.ON else _traced_page(rows, et, lo, hi))
            t.add_done_callback(_retrieve)
            return t

        req = state.request(bound)
        if req is None:
            return
        pending: asyncio.Task[list[Any]] | None = read(req)
        try:
            while pending is not None:
                rows = await pending
                pending = None
                keys = (
                    await self.serializers.load_keys((r["persistence_id"], r["event_ser_id"]) for r in rows)
                    if self.serializers.keyed
                    else ()
                )
                page = _Page(rows, state.offset, self.serializers, keys)
                if rows:
                    state.offset = page.offset_at(len(rows) - 1)
                state.accept_page(req, len(rows), rows[-1]["db_timestamp"] if rows else None, bound)
                if state.needs_probe:
                    found = await b.next_slice_timestamp(slices, state.probe_from, bound)
                    state.skip_to(found if found is not None else bound)
                nxt = None if state.caught_up else state.request(bound)
                if nxt is not None:
                    pending = read(nxt)
                    req = nxt
                if rows:
                    yield page
        finally:
            if pending is not None:
                pending.cancel()

    def current(
        self, et: str, lo: int, hi: int, offset: TimestampOffset | None, mode: QueryMode
    ) -> AsyncIterator[EventEnvelope]:
        """Up to the bound taken when iteration starts, then end."""
        state = SliceQueryState(offset, self.q.buffer_size, self.q.catch_up_buffer_size)
        return self._catch_up(state, mode, et, lo, hi)

    def current_row_pages(
        self, et: str, lo: int, hi: int, offset: TimestampOffset | None, mode: QueryMode
    ) -> AsyncIterator[Page]:
        """:meth:`current` a page of rows at a time (each non-empty): for a consumer that takes
        every row of a page a column at a time (:mod:`.page_columns`)."""
        state = SliceQueryState(offset, self.q.buffer_size, self.q.catch_up_buffer_size)
        return self._row_pages(state, mode, et, lo, hi)

    async def live(
        self, et: str, lo: int, hi: int, offset: TimestampOffset | None, mode: QueryMode, heartbeats: bool
    ) -> AsyncIterator[EventEnvelope]:
        """:meth:`live_pages`, one envelope at a time."""
        async for page in self.live_pages(et, lo, hi, offset, mode, heartbeats):
            for env in page:
                yield env

    async def live_pages(
        self,
        et: str,
        lo: int,
        hi: int,
        offset: TimestampOffset | None,
        mode: QueryMode,
        heartbeats: bool,
        *,
        state: SliceQueryState | None = None,
    ) -> AsyncIterator[list[EventEnvelope]]:
        """The live query, a page at a time: each yield is a non-empty list of envelopes in
        delivery order (the consumer's to keep); a heartbeat comes alone in its list. ``state``:
        go on from a query's state (its offset and floor: the query that starts from snapshots)."""
        loop = asyncio.get_running_loop()
        q = self.q
        sub = await self.hub.subscribe(et, lo, hi)
        if state is None:
            state = SliceQueryState(offset, q.buffer_size, q.catch_up_buffer_size)
        bt = BacktrackingState(offset, q) if mode == "backtracking" else None
        order = PidOrder(self.backend, bt, q.buffer_size) if bt is not None else None
        down = Condition(log, logging.WARNING)  # an outage: logged once, and when it ends
        last_emit = loop.time()
        last_heartbeat: TimestampOffset | None = None
        failures = 0
        try:
            while True:
                self._check_open()
                sub.wake.clear()
                try:
                    bound = await self.bound(mode, fresh_after=loop.time())
                    emitted = False
                    async for page in self._catch_up_pages(state, bound, et, lo, hi):
                        if bt is not None and order is not None:
                            page = await self._not_yet_delivered(bt, order, page)
                            if not page:
                                continue
                        yield page
                        emitted = True  # the clock is read once per pass, not per page
                    if emitted:
                        last_emit = loop.time()
                    if bt is not None and order is not None:
                        async for env in self._backtrack(bt, order, state, et, lo, hi):
                            yield [env]
                            last_emit = loop.time()
                    failures = 0
                except JournalUnavailable as e:
                    delay = self.settings.retry.backoff(failures)
                    failures += 1
                    down.occurred("live slice query %s %d-%d: %s; retrying with backoff", et, lo, hi, e)
                    await asyncio.sleep(delay)
                    continue
                if down.active:
                    down.clear(f"live slice query {et} {lo}-{hi}: database available again")
                if heartbeats:
                    hb = self._heartbeat_offset(state, bt)
                    if hb is not None and hb != last_heartbeat and loop.time() - last_emit >= q.heartbeat_interval:
                        last_heartbeat = hb
                        last_emit = loop.time()
                        yield [self.heartbeat(et, lo, hb)]
                await _wait(sub, self._next_poll(state, bt, heartbeats))
        finally:
            sub.close()

    def _next_poll(self, state: SliceQueryState, bt: BacktrackingState | None, heartbeats: bool) -> float:
        """Seconds until a live query's next pass when no notification wakes it (0: at once)."""
        q = self.q
        delay = poll_delay(state.last_count, q.buffer_size, q.refresh_interval) if state.caught_up else 0.0
        if heartbeats:
            delay = min(delay, q.heartbeat_interval)
        if bt is not None:
            delay = min(delay, bt.next_poll_delay(delay))
        return delay

    async def _not_yet_delivered(
        self, bt: BacktrackingState, order: PidOrder, page: list[EventEnvelope]
    ) -> list[EventEnvelope]:
        """Backtracking mode: the envelopes of a live page not delivered yet, each preceded by
        the earlier events of its pid that committed late."""
        out: list[EventEnvelope] = []
        for env in page:
            bt.count_live()
            pid, seq_nr = env.persistence_id, env.seq_nr
            first = bt.first_undelivered(pid, seq_nr)
            if first is None:
                continue
            if first != seq_nr:  # earlier events of this pid committed late
                for r in await self._earlier(order, pid, first, seq_nr, env.db_timestamp):
                    out.append(self.envelope(r, bt.offset_for(r), source="backtracking"))
            bt.mark(pid, seq_nr, env.db_timestamp)
            out.append(env)
        return out

    async def _earlier(self, order: PidOrder, pid: str, first: int, seq_nr: int, ts: datetime) -> list[StoredEvent]:
        """``order.before``, retried here until the database answers: the live page around it is
        already counted as read, so giving up would skip the rest of the page."""
        failures = 0
        while True:
            self._check_open()
            try:
                return await order.before(pid, first, seq_nr, ts)
            except JournalUnavailable as e:
                delay = self.settings.retry.backoff(failures)
                failures += 1
                level = logging.WARNING if failures == 1 else logging.DEBUG
                log.log(level, "earlier events of %s: %s; retrying", pid, e)
                await asyncio.sleep(delay)

    def _heartbeat_offset(self, state: SliceQueryState, bt: BacktrackingState | None) -> TimestampOffset | None:
        hb = state.heartbeat_offset()
        if hb is None or bt is None:
            return hb
        safe = bt.safe_timestamp(hb.timestamp)
        last = state.offset.timestamp if state.offset is not None else None
        if safe is None or (last is not None and safe <= last):
            return None
        return TimestampOffset(safe)

    async def _backtrack(
        self, bt: BacktrackingState, order: PidOrder, state: SliceQueryState, et: str, lo: int, hi: int
    ) -> AsyncIterator[EventEnvelope]:
        """Re-read the window behind the live position without payloads; deliver what is new."""
        b = self.backend
        slices = SliceRange(et, lo, hi)
        now = await b.db_now()
        while True:
            req = bt.request(state, now)
            if req is None:
                return
            rows = await b.read_slice_page(slices, req, with_payload=False)
            for r in rows:
                pid, seq_nr = r.persistence_id, r.seq_nr
                first = bt.first_undelivered(pid, seq_nr)
                if first is None:
                    continue
                earlier = await order.before(pid, first, seq_nr, r.db_timestamp)
                if self.serializers.keyed:
                    _held = await self.serializers.load_keys((e.persistence_id, e.ser_id) for e in earlier)
                for e in earlier:
                    yield self.envelope(e, bt.offset_for(e), source="backtracking")
                full = await b.load_event(pid, seq_nr)
                if full is not None and self.serializers.keyed:
                    _held = await self.serializers.load_keys([(full.persistence_id, full.ser_id)])
                bt.mark(pid, seq_nr, r.db_timestamp)
                if full is None:  # deleted meanwhile
                    continue
                yield self.envelope(full, bt.offset_for(r), source="backtracking")
            bt.accept(req, rows)

    async def events_by_persistence_id(
        self,
        read_events: Callable[[str, int, int, int], Awaitable[list[StoredEvent]]],
        pid: str,
        from_seq_nr: int,
    ) -> AsyncIterator[EventEnvelope]:
        """Live events of one pid: pages by seq_nr, woken by the pid's slice notifications."""
        sub = await self.hub.subscribe(entity_type_of(pid), slice_for(pid), slice_for(pid))
        nxt = from_seq_nr
        failures = 0
        page = self.q.buffer_size
        down = Condition(log, logging.WARNING)
        try:
            while True:
                self._check_open()
                sub.wake.clear()
                try:
                    rows: list[StoredEvent] = await read_events(pid, nxt, MAX_SEQ_NR, page)
                    failures = 0
                except JournalUnavailable as e:
                    delay = self.settings.retry.backoff(failures)
                    failures += 1
                    down.occurred("live events of %s: %s; retrying with backoff", pid, e)
                    await asyncio.sleep(delay)
                    continue
                if down.active:
                    down.clear(f"live events of {pid}: database available again")
                if self.serializers.keyed:
                    _held = await self.serializers.load_keys((r.persistence_id, r.ser_id) for r in rows)
                for r in rows:
                    yield self.envelope(r, SeqOffset(r.seq_nr))
                    nxt = r.seq_nr + 1
                if len(rows) < page:
                    await _wait(sub, poll_delay(len(rows), page, self.q.refresh_interval) or 0.0)
        finally:
            sub.close()


class _Page:
    """One page of rows (columns named as ``SLICE_ROW_COLUMNS``): decodes an envelope's event and
    computes its offset when first asked, once (:class:`~journal.envelope.LazySource`).

    An envelope's offset is its timestamp and the highest seq_nr per pid among the rows at that
    timestamp up to it, plus ``base.seen`` (the offset before this page) when the page starts at
    that timestamp: what ``SliceQueryState.offset_for`` gives row by row, computed only on demand.
    """

    __slots__ = ("_events", "_memo", "_offsets", "_plain_json", "base", "keys", "rows", "serializers")

    def __init__(
        self, rows: list[Any], base: TimestampOffset | None, serializers: SerializerRegistry, keys: KeysInUse = ()
    ) -> None:
        self.rows = rows
        self.keys = keys
        """The page's keys, held while its envelopes may still be decoded (not evicted meanwhile)."""
        self.base = base
        self.serializers = serializers
        self._memo: tuple[int, TimestampOffset] | None = None
        self._events: dict[int, Any] = {}
        self._offsets: dict[int, TimestampOffset] = {}
        self._plain_json = serializers.plain_json_reader()

    def event_at(self, i: int) -> Any:
        events = self._events
        if i in events:
            return events[i]
        r = self.rows[i]
        if r["event_ser_id"] == JSON_SERIALIZER_ID and not r["event_ser_manifest"]:
            try:
                event = events[i] = self._plain_json(r["event_payload"])
                return event
            except ValueError:  # not JSON: the general path below says so, located
                pass
        try:
            event = self.serializers.deserialize(
                r["event_ser_id"], r["event_ser_manifest"], r["event_payload"], pid=r["persistence_id"]
            )
        except SerializationError as e:
            raise e.located(f"{r['persistence_id']}#{r['seq_nr']}") from e
        events[i] = event
        return event

    def stored_json_at(self, i: int) -> bytes | None:
        r = self.rows[i]
        return stored_plain_json(r["event_ser_id"], r["event_ser_manifest"], r["event_payload"])

    def metadata(self, r: Any) -> Any:
        try:
            return self.serializers.deserialize(
                r["meta_ser_id"], r["meta_ser_manifest"] or "", r["meta_payload"] or b"", what="metadata"
            )
        except SerializationError as e:
            raise e.located(f"{r['persistence_id']}#{r['seq_nr']}") from e

    def offset_at(self, i: int) -> TimestampOffset:
        o = self._offsets.get(i)
        if o is None:
            o = self._offsets[i] = self._offset(i)
        return o

    def _offset(self, i: int) -> TimestampOffset:
        rows = self.rows
        r = rows[i]
        ts = r["db_timestamp"]
        if ts.tzinfo is not UTC:
            ts = ts.astimezone(UTC)
        memo = self._memo
        seen: dict[str, int]
        if memo is not None and memo[0] == i - 1 and memo[1].timestamp == ts:
            seen = dict(memo[1].seen)  # consecutive access within one timestamp: no rescan
            seen[r["persistence_id"]] = r["seq_nr"]
        else:
            seen = {r["persistence_id"]: r["seq_nr"]}
            j = i - 1
            while j >= 0 and rows[j]["db_timestamp"] == ts:
                seen.setdefault(rows[j]["persistence_id"], rows[j]["seq_nr"])  # later rows hold the higher seq_nr
                j -= 1
            base = self.base
            if j < 0 and base is not None and base.timestamp == ts:
                for pid, seq in base.seen.items():
                    seen.setdefault(pid, seq)
        o = TimestampOffset.trusted(ts, seen)
        if i + 1 < len(rows) and rows[i + 1]["db_timestamp"] == ts:
            self._memo = (i, o)
        return o


Page = _Page
"""The lazy page of slice-query rows, for the query that starts from snapshots (its rows are
slice rows with snapshot columns beside)."""


async def _traced_page(rows: Awaitable[list[Any]], et: str, lo: int, hi: int) -> list[Any]:
    with tracing.span("journal.slice_page", attributes={"entity_type": et, "slices": f"{lo}-{hi}"}) as s:
        got = await rows
        s.set_attribute("rows", len(got))
        return got


def _retrieve(t: asyncio.Task[list[Any]]) -> None:
    if not t.cancelled():
        t.exception()  # an abandoned prefetch's error is not an unhandled one


async def _wait(sub: Subscription, delay: float) -> None:
    if delay <= 0:
        return
    await wait_set(sub.wake, delay)
