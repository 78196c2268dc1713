"""Backtracking mode (the reference's way): a payload-free re-read of a window behind the live
position, for databases where a safe horizon cannot be derived (clock skew, foreign writers).

The live query stays ``behind_current_time`` behind the database's now; backtracking re-reads
``[live - backtracking_window, min(live, now - backtracking_behind_current_time))`` when the live
query was idle 5 times in a row, after 3 x buffer_size live rows, or when the live position ran
half a window ahead of the backtracking position (the reference's triggers). Each pid's highest
delivered seq_nr (kept for the window) tells new events from ones already delivered, so the
query itself delivers each event once; events found only by backtracking get their payload
loaded before delivery. Each pid's events also come in order: an event whose pid has earlier
events not yet delivered (the first events of a new pid committed late while a racing writer's
next events were already read live) gets those read by pid and delivered first
(:mod:`journal.query.pid_order`). Limit: an event committed later than
``backtracking_behind_current_time`` after its timestamp is missed; after a restart from a
saved offset, backtracking re-reads the window behind it and may deliver events at or below
that offset again (the projection's offset store drops them); events after it come once.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ..backend import PageRequest, StoredEvent
from ..offsets import EPOCH, TimestampOffset
from ..settings import QuerySettings
from .slice_query import SliceQueryState

IDLE_TRIGGER = 5
UNKNOWN = 0
"""``first_undelivered``: a pid not in memory; look up its previous event."""
ROWS_TRIGGER_PAGES = 3


class BacktrackingState:
    def __init__(self, offset: TimestampOffset | None, q: QuerySettings) -> None:
        self.q = q
        self.window = timedelta(seconds=q.backtracking_window)
        self.behind = timedelta(seconds=q.backtracking_behind_current_time)
        self.pager: SliceQueryState | None = None
        self.active = False
        self.upper: datetime = EPOCH
        self.idle = 0
        self.live_rows = 0
        self.delivered: dict[str, tuple[int, datetime]] = {}
        self.covered_below: datetime = offset.timestamp if offset is not None else EPOCH
        if offset is not None:
            for pid, seq in offset.seen.items():
                self.delivered[pid] = (seq, offset.timestamp)
        self.rounds = 0

    # -- each pid once and in order ----------------------------------------------------------

    def first_undelivered(self, pid: str, seq_nr: int) -> int | None:
        """For an event about to be delivered: None when it was delivered already; else the first
        seq_nr of its pid still to deliver (``seq_nr`` itself when nothing is missing before it),
        or UNKNOWN for a pid not in memory with ``seq_nr`` > 1 (its previous event's timestamp
        decides: :meth:`covered`). A lower number means earlier events of the pid committed late,
        below the live position, and must be delivered first (read by pid)."""
        got = self.delivered.get(pid)
        if got is not None:
            return None if seq_nr <= got[0] else got[0] + 1
        return 1 if seq_nr == 1 else UNKNOWN

    def covered(self, ts: datetime) -> bool:
        """An event below this was delivered before (by this query within the window, whose
        pids are then pruned, or before the offset it started from)."""
        return ts < self.covered_below

    def mark(self, pid: str, seq_nr: int, ts: datetime) -> None:
        got = self.delivered.get(pid)
        if got is None or seq_nr > got[0]:
            self.delivered[pid] = (seq_nr, ts)

    def count_live(self) -> None:
        self.live_rows += 1

    # -- rounds ------------------------------------------------------------------------------

    def _triggered(self, live: SliceQueryState) -> bool:
        if live.caught_up and live.last_count == 0:
            self.idle += 1
        else:
            self.idle = 0
        live_ts = live.safe_timestamp
        pos = self.pager.safe_timestamp if self.pager is not None else None
        return (
            self.idle >= IDLE_TRIGGER
            or self.live_rows >= ROWS_TRIGGER_PAGES * self.q.buffer_size
            or (pos is not None and live_ts - pos >= self.window / 2)
        )

    def request(self, live: SliceQueryState, now: datetime) -> PageRequest | None:
        """The next payload-free page of the current round, or None (no round, or it ended)."""
        if not self.active:
            if not self._triggered(live):
                return None
            # The live query's read position (not just its last event): a late event above
            # the last delivered one but below where the live query already read must be covered.
            live_ts = live.safe_timestamp
            self.upper = min(live_ts, now - self.behind)
            lower = live_ts - self.window
            if self.pager is None:
                self.pager = SliceQueryState(None, self.q.buffer_size)
            self.pager.floor = max(self.pager.floor, lower)
            self.active = True
            self.rounds += 1
            self._prune(lower)
        assert self.pager is not None
        req = self.pager.request(self.upper)
        if req is None:
            self._end_round()
        return req

    def accept(self, req: PageRequest, rows: list[StoredEvent]) -> None:
        assert self.pager is not None
        for r in rows:
            self.pager.offset_for(r)
        self.pager.accept(req, rows, self.upper)
        self.pager.needs_probe = False  # empty windows grow quickly; no probe needed
        if self.pager.caught_up:
            self._end_round()

    def _end_round(self) -> None:
        self.active = False
        self.idle = 0
        self.live_rows = 0

    def offset_for(self, r: StoredEvent) -> TimestampOffset:
        return TimestampOffset(r.db_timestamp, {r.persistence_id: r.seq_nr})

    def next_poll_delay(self, delay: float) -> float:
        return 0.0 if self.active else delay

    def safe_timestamp(self, live_floor: datetime) -> datetime | None:
        """For heartbeats: below this every event was seen by backtracking or the live query."""
        if self.pager is None:
            return None
        return min(live_floor, self.pager.safe_timestamp)

    def _prune(self, lower: datetime) -> None:
        self.covered_below = max(self.covered_below, lower)
        old = [pid for pid, (_, ts) in self.delivered.items() if ts < lower]
        for pid in old:
            del self.delivered[pid]
