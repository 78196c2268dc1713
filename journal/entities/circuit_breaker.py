"""A circuit breaker for entity writes: stop hammering a database that does not answer.

Plain state machine (closed -> open -> half-open -> closed) with an injectable clock, so a test
can drive it step by step. Writes are already retried by the journal (``retry.attempts``); the
breaker counts those *failed writes*, not individual connection attempts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum

from ..errors import CircuitBreakerOpen


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class CircuitBreaker:
    """Opens after ``failures`` consecutive failures; after ``reset_timeout`` lets one trial pass.

    Any success (a write, or a read made while resolving an unknown outcome) closes it: the
    database answered.
    """

    def __init__(self, failures: int, reset_timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.failures_to_open = failures
        self.reset_timeout = reset_timeout
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._trial_running = False
        self._trial_started = 0.0
        self.times_opened = 0

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.reset_timeout:
            return BreakerState.HALF_OPEN
        return self._state

    def check(self) -> None:
        """Raise :class:`CircuitBreakerOpen` unless a write may be attempted now."""
        state = self.state
        if state is BreakerState.CLOSED:
            return
        now = self._clock()
        if state is BreakerState.HALF_OPEN and (
            not self._trial_running or now - self._trial_started >= self.reset_timeout
        ):
            self._trial_running = True  # one trial at a time (a lost trial expires)
            self._trial_started = now
            return
        raise CircuitBreakerOpen(
            f"circuit breaker open after {self._failures} failed writes: the journal is "
            f"unavailable (next trial in {self._remaining():.2f}s)"
        )

    def _remaining(self) -> float:
        return max(0.0, self.reset_timeout - (self._clock() - self._opened_at))

    def record_success(self) -> None:
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._trial_running = False

    def record_failure(self) -> None:
        self._failures += 1
        self._trial_running = False
        if self._state is BreakerState.OPEN or self._failures >= self.failures_to_open:
            if self._state is not BreakerState.OPEN:
                self.times_opened += 1
            self._state = BreakerState.OPEN
            self._opened_at = self._clock()
