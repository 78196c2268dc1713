"""Failure detection (model layer, no I/O): Available / Unavailable(causes) per remote log.

Fed with each read's outcome; :meth:`FailureDetector.check` is called once per failure-detection
limit and says what to publish: ``Available`` if a read succeeded within the limit, else
``Unavailable`` with the causes gathered since the last publication.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Available:
    endpoint: str
    log_name: str


@dataclass(frozen=True, slots=True)
class Unavailable:
    endpoint: str
    log_name: str
    causes: tuple[str, ...]


Availability = Available | Unavailable


class FailureDetector:
    """One remote log's detector. Times are monotonic seconds supplied by the caller."""

    def __init__(self, endpoint: str, log_name: str, limit: float, now: float) -> None:
        self.endpoint = endpoint
        self.log_name = log_name
        self.limit = limit
        self.last_success: float | None = None
        self.started = now
        self.causes: list[str] = []
        self.state: Availability | None = None

    def success(self, now: float) -> None:
        self.last_success = now

    def failure(self, cause: BaseException | str) -> None:
        text = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
        if len(self.causes) < 20 and text not in self.causes:
            self.causes.append(text)

    def check(self, now: float) -> Availability | None:
        """What to publish now (None before a full limit has passed without any success)."""
        if self.last_success is not None and now - self.last_success <= self.limit:
            self.state = Available(self.endpoint, self.log_name)
        elif now - self.started >= self.limit:
            self.state = Unavailable(self.endpoint, self.log_name, tuple(self.causes) or ("no reply",))
        else:
            return None
        self.causes = []
        return self.state
