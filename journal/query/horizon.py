"""The horizon: a timestamp below which no uncommitted event can still land.

The write rule (see :mod:`journal.postgres.statements`): a write takes its db_timestamp from
the clock *during execution*, after its statement holds RowExclusiveLock on event_journal, and
never below its transaction's start. So, for a reading that takes the clock (``now``) first and
then lists the lock holders:

- a writer that takes the lock after the listing has a timestamp > ``now``;
- a writer listed has a timestamp >= its ``xact_start``;
- a writer that released the lock before the listing has committed (or aborted), and is visible
  to any snapshot taken after the reading.

Hence ``min(now, xact_start of every listed writer)`` is safe for a data query whose snapshot
is taken after the reading. pg_locks and pg_stat_activity are two readings, one after the other
(both after ``now``): a listed writer whose activity row shows no transaction (idle, or a next
statement not yet in its transaction) or no row at all has ended its listed transaction before
the activity reading, or began it after that reading (so after ``now``); either way it needs
no bound, and the backend leaves it out. Under write load that happens on most readings; it
was once taken for "start not visible" and logged several times a second.

When a writer's start is really not visible (another role without pg_read_all_stats, or a
prepared transaction), the bound for it is the ``now`` of the previous reading if it was not
listed then (it took the lock after that listing), or the bound already given to it; a writer
listed in the very first reading with an unknown start blocks the horizon at the epoch until it
ends. That condition is logged once when it starts and once when it clears (it persists for as
long as the role lacks the privilege), never guessed.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from ..backend import HorizonReading, SliceQueryBackend
from ..conditions import Condition
from ..offsets import EPOCH

log = logging.getLogger("journal.query.horizon")

INVISIBLE_QUIET = 60.0
"""Seconds without a writer whose start is not visible before that condition counts as cleared."""


class HorizonTracker:
    """Turns successive readings into safe bounds (a plain state machine, no I/O)."""

    def __init__(self, quiet: float = INVISIBLE_QUIET) -> None:
        self._prev_now: datetime | None = None
        self._bounds: dict[str, datetime | None] = {}
        self._logged_prepared = False
        self.invisible = Condition(log, logging.INFO, quiet=quiet)
        """Writers whose start this role cannot see (logged once, and when it clears)."""

    def observe(self, reading: HorizonReading) -> datetime:
        bound = reading.now
        bounds: dict[str, datetime | None] = {}
        for w in reading.writers:
            b: datetime | None
            if w.xact_start is not None:
                b = w.xact_start
            elif w.vxid in self._bounds:
                b = self._bounds[w.vxid]
            else:
                b = self._prev_now
                self.invisible.occurred(
                    "horizon: start of writer %s (pid %s) not visible%s; bounding it by %s",
                    w.vxid, w.pid,
                    " (prepared transaction)" if w.pid is None else " (this role lacks pg_read_all_stats?)",
                    b.isoformat() if b else "the epoch (it was already writing at the first check)",
                )  # fmt: skip
            bounds[w.vxid] = b
            bound = min(bound, b if b is not None else EPOCH)
        if reading.prepared and not self._logged_prepared:
            log.warning(
                "horizon: %d prepared transaction(s) exist; their writes are bounded by the fallback",
                reading.prepared,
            )
            self._logged_prepared = True
        if all(w.xact_start is not None for w in reading.writers):
            self.invisible.idle("horizon: writers whose start is not visible")
        self._bounds = bounds
        self._prev_now = reading.now
        return bound

    @property
    def has_first_check_unknowns(self) -> bool:
        return any(b is None for b in self._bounds.values())


class Horizon:
    """One per journal: shared, coalesced horizon readings.

    ``bound(fresh_after)`` returns a bound from a reading started at or after ``fresh_after``
    (loop time), taking a new reading only when none is recent enough, so many live queries woken
    by one notification share one pg_locks read.
    """

    def __init__(self, backend: SliceQueryBackend) -> None:
        self._backend = backend
        self._tracker = HorizonTracker()
        self._lock = asyncio.Lock()
        self._last: tuple[float, datetime] | None = None
        self.readings = 0

    async def bound(self, fresh_after: float | None = None) -> datetime:
        loop = asyncio.get_running_loop()
        if fresh_after is None:
            fresh_after = loop.time()
        async with self._lock:
            if self._last is not None and self._last[0] >= fresh_after:
                return self._last[1]
            started = loop.time()
            value = self._tracker.observe(await self._backend.horizon_reading())
            self.readings += 1
            if self.readings == 1 and self._tracker.has_first_check_unknowns:
                started = loop.time()
                value = self._tracker.observe(await self._backend.horizon_reading())
            self._last = (started, value)
            return value
