"""The by-slice query as a plain state machine (no I/O): what to read next, what it delivered.

The state is the last delivered offset (timestamp + ``seen`` at exactly that timestamp) and a
``floor``: every event of the range below it has been delivered. Pages hold ``buffer_size`` rows
at the tail and ``catch_up_size`` rows far from it (a window that ends before the bound, or after
a full page), so a backlog costs fewer round trips while the live tail keeps small pages. Each step reads the range in
``[start, min(bound, start + span))`` where ``bound`` is safe (the horizon, or now minus
behind-current-time in backtracking mode) and ``span`` adapts to the density of the data, so far
from the tail a query scans about one page of the index instead of everything up to the tail
(the reference counts rows in time buckets with extra queries; this needs none). When a window
comes back empty, a probe (one index lookup per slice) jumps to the next stored timestamp.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from ..backend import PageRequest, StoredEvent
from ..offsets import EPOCH, TimestampOffset

MIN_SPAN = timedelta(milliseconds=1)
MAX_SPAN = timedelta(days=3650)
INITIAL_SPAN = timedelta(seconds=10)
_EMPTY: Mapping[str, int] = MappingProxyType({})


class SliceQueryState:
    """Paging over one slice range. Drive it: ``request(bound)`` -> read -> ``accept(...)``;
    when ``needs_probe``: probe ``[probe_from, bound)`` -> ``skip_to(found or bound)``."""

    def __init__(self, offset: TimestampOffset | None, buffer_size: int, catch_up_size: int | None = None) -> None:
        self.offset = offset
        self.floor = offset.timestamp if offset is not None else EPOCH
        self.buffer_size = buffer_size
        self.catch_up_size = max(buffer_size, catch_up_size or buffer_size)
        self.behind = False  # the last page was full: a backlog is waiting
        self.span = INITIAL_SPAN
        self.needs_probe = False
        self.probe_from = self.floor
        self.caught_up = False
        self.last_count = 0

    def start(self) -> tuple[datetime, Mapping[str, int]]:
        o = self.offset
        if o is not None and o.timestamp >= self.floor:
            return o.timestamp, o.seen
        return self.floor, _EMPTY

    def request(self, bound: datetime) -> PageRequest | None:
        """The next page to read below ``bound``, or None when there is nothing below it."""
        start, seen = self.start()
        if start >= bound:
            self.caught_up = True
            self.last_count = 0
            return None
        if bound - start > self.span:  # far from the bound: a window of span, a catch-up page
            return PageRequest(start, seen, start + self.span, self.catch_up_size)
        limit = self.catch_up_size if self.behind else self.buffer_size
        return PageRequest(start, seen, bound, limit)

    def offset_for(self, row: StoredEvent) -> TimestampOffset:
        """Advance the delivered offset past ``row`` (rows must come in query order)."""
        return self.advance(row.db_timestamp, row.persistence_id, row.seq_nr)

    def advance(self, ts: datetime, persistence_id: str, seq_nr: int) -> TimestampOffset:
        """Advance the delivered offset past the event ``persistence_id#seq_nr`` at ``ts``."""
        o = self.offset
        if ts.tzinfo is not UTC:
            ts = ts.astimezone(UTC)
        if o is not None and ts == o.timestamp:
            seen = dict(o.seen)
            seen[persistence_id] = seq_nr
        else:
            seen = {persistence_id: seq_nr}
        new = TimestampOffset.trusted(ts, seen)
        self.offset = new
        return new

    def accept(self, req: PageRequest, rows: list[StoredEvent], bound: datetime) -> None:
        """Record a page's outcome (after its rows went through ``offset_for``)."""
        self.accept_page(req, len(rows), rows[-1].db_timestamp if rows else None, bound)

    def accept_page(self, req: PageRequest, n: int, last_timestamp: datetime | None, bound: datetime) -> None:
        """Record a page of ``n`` rows whose last is at ``last_timestamp``, after ``offset``
        was advanced past its last row."""
        self.last_count = n
        self.behind = n >= req.limit
        if n >= req.limit:
            assert last_timestamp is not None
            covered = last_timestamp - req.from_timestamp
            self.span = _clamp(covered * 1.25)
            self.caught_up = False
            return
        # Everything below the window's end is delivered.
        self.floor = max(self.floor, req.to_timestamp)
        if req.to_timestamp >= bound:
            self.caught_up = True
            return
        self.caught_up = False
        factor = min(8.0, max(1.5, 0.8 * req.limit / max(n, 1)))
        self.span = _clamp(self.span * factor)
        if n == 0:
            self.needs_probe = True
            self.probe_from = req.to_timestamp

    def skip_to(self, timestamp: datetime) -> None:
        """The probe found nothing in ``[probe_from, timestamp)``."""
        self.needs_probe = False
        self.floor = max(self.floor, timestamp)

    @property
    def safe_timestamp(self) -> datetime:
        """Every event below this is delivered (what a heartbeat reports)."""
        o = self.offset
        if o is None:
            return self.floor
        return max(self.floor, o.timestamp)

    def heartbeat_offset(self) -> TimestampOffset | None:
        """An offset past everything delivered, when the floor is above the last event."""
        o = self.offset
        if o is not None and o.timestamp >= self.floor:
            return None
        return TimestampOffset(self.floor)


def _clamp(span: timedelta) -> timedelta:
    return max(MIN_SPAN, min(MAX_SPAN, span))


def poll_delay(last_count: int, buffer_size: int, refresh_interval: float) -> float:
    """The reference's adaptive polling: <=10% full -> refresh_interval; 10-90% -> half; more -> 0."""
    fill = last_count / buffer_size
    if fill >= 0.9:
        return 0.0
    if fill > 0.1:
        return refresh_interval / 2
    return refresh_interval
