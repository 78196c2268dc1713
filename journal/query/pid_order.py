"""Backtracking mode: the earlier events of a pid that an event must not overtake.

An event of a pid whose earlier events are not delivered yet (typically the first events of a
new pid whose insert stalled after taking its timestamp, while a racing writer's next events of
that pid were already read by the live query) would overtake them, and backtracking would later
take them for duplicates. They are committed (the later event was written after them), so one
read by pid finds them, and they are delivered first.
"""

from __future__ import annotations

from datetime import datetime

from ..backend import SliceQueryBackend, StoredEvent
from .backtracking import UNKNOWN, BacktrackingState


class PidOrder:
    """Finds, for an event of a pid, the earlier events of that pid still to deliver."""

    def __init__(self, backend: SliceQueryBackend, bt: BacktrackingState, page: int) -> None:
        self.backend = backend
        self.bt = bt
        self.page = page
        self.filled = 0
        """Events delivered early this way (for tests and logs)."""

    async def before(self, pid: str, first: int, seq_nr: int, ts: datetime) -> list[StoredEvent]:
        """The undelivered events of ``pid`` below ``seq_nr``, in order, marked delivered.

        ``first`` is :meth:`BacktrackingState.first_undelivered`'s answer (not None): a known
        first missing seq_nr, or UNKNOWN (a pid not in memory): then its previous event's
        timestamp decides; an event the query covers (:meth:`BacktrackingState.covered`) was
        delivered, otherwise the pid's events from the first uncovered one are read. ``ts`` is
        the event's own timestamp: when the query covers it, it covers everything before it.
        """
        bt = self.bt
        if first == seq_nr:
            return []
        filter_covered = first == UNKNOWN
        if filter_covered:
            if bt.covered(ts):  # an older event (re-read behind a restart offset): no lookup
                return []
            prev = await self.backend.timestamp_of(pid, seq_nr - 1)
            if prev is None or bt.covered(prev):
                return []
            first = 1
        out: list[StoredEvent] = []
        nxt = first
        while nxt < seq_nr:
            rows = await self.backend.read_events(pid, nxt, seq_nr - 1, self.page)
            for r in rows:
                if filter_covered and bt.covered(r.db_timestamp):
                    continue
                out.append(r)
            if len(rows) < self.page:
                break
            nxt = rows[-1].seq_nr + 1
        for r in out:  # only once every read succeeded: the caller delivers them all next
            bt.mark(pid, r.seq_nr, r.db_timestamp)
        self.filled += len(out)
        return out
