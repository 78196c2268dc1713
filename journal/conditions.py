"""A persisting condition logged once when it starts and once when it clears, not per reading.

A database that is down, or writers whose start this role cannot see, show up on every reading
or attempt; logging each one buries everything else. :class:`Condition` logs the first one at the
given level, the repeats at DEBUG, and one line when the condition clears, saying for how long it
held and how often it was met. Pure Python, no I/O; time is the monotonic clock.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime


class Condition:
    """One named condition of one component (e.g. "database unavailable")."""

    def __init__(self, log: logging.Logger, level: int = logging.WARNING, *, quiet: float = 0.0) -> None:
        """``quiet``: a condition met only now and then clears after this many seconds without
        an occurrence (:meth:`idle`); 0 clears it at the first :meth:`idle` call."""
        self.log = log
        self.level = level
        self.quiet = quiet
        self.since: datetime | None = None
        """When the condition started (None: it does not hold)."""
        self.count = 0
        self.last_detail = ""
        self._started = 0.0
        self._last = 0.0

    @property
    def active(self) -> bool:
        return self.since is not None

    def occurred(self, msg: str, *args: object) -> None:
        """The condition was met (again): logged at ``level`` the first time, then at DEBUG."""
        now = time.monotonic()
        self.count += 1
        self._last = now
        self.last_detail = msg % args if args else msg
        if self.since is None:
            self.since = datetime.now(UTC)
            self._started = now
            self.log.log(self.level, "%s (logged once until it clears)", self.last_detail)
        else:
            self.log.debug("%s", self.last_detail)

    def idle(self, what: str = "") -> None:
        """A reading or attempt without the condition: it clears after ``quiet`` seconds of these."""
        if self.since is not None and time.monotonic() - self._last >= self.quiet:
            self.clear(what)

    def clear(self, what: str = "") -> None:
        """The condition is over: one line, then silence until it is met again."""
        if self.since is None:
            return
        held = time.monotonic() - self._started
        self.log.log(
            self.level if self.level < logging.WARNING else logging.INFO,
            "%s: cleared after %.1fs (%d occurrence%s)",
            what or self.last_detail, held, self.count, "" if self.count == 1 else "s",
        )  # fmt: skip
        self.since = None
        self.count = 0
