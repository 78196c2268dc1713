"""What a projection does when its handler keeps failing (Akka Projection's HandlerRecoveryStrategy).

- ``fail``: stop at the first failure (the batch is rolled back; a restart tries again);
- ``retry-and-fail``: ``attempts`` tries with backoff, then stop (the default: what workers did
  before strategies existed);
- ``retry-and-skip``: the tries, then the event is skipped: the offset moves past it;
- ``retry-and-dead-letter``: the tries, then the event is parked in ``projection_dead_letter``
  in the same transaction that moves the offset past it (``projections dead-letters retry``);
- ``retry-and-dead-letter-sequenced``: as ``retry-and-dead-letter``, and every later event of the
  dead letter's persistence id is parked behind it (``projection_parked_event``, :mod:`.sequencing`)
  until the dead letter is retried or discarded, which applies them in order.

Skipping and dead-lettering act on one event: a grouped batch that fails is split in halves, each
committed on its own, until the poisoned event is alone (see docs/handler-failures.md).
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import get_args

from journal.errors import ConfigurationError
from journal.settings import HandlerRecoveryKind, ProjectionSettings

KINDS: tuple[str, ...] = get_args(HandlerRecoveryKind)


@dataclass(frozen=True)
class HandlerRecovery:
    """A projection's failure strategy; ``attempts`` None takes ``projection.handler_attempts``."""

    kind: HandlerRecoveryKind = "retry-and-fail"
    attempts: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigurationError(f"handler recovery must be one of {', '.join(KINDS)}; got {self.kind!r}")
        if self.attempts is not None and (isinstance(self.attempts, bool) or self.attempts < 1):
            raise ConfigurationError(f"handler recovery attempts must be >= 1, got {self.attempts!r}")
        if self.kind == "fail" and self.attempts not in (None, 1):
            raise ConfigurationError("handler recovery 'fail' makes one attempt; use retry-and-fail:N")

    @classmethod
    def parse(cls, spec: str | HandlerRecovery | None, settings: ProjectionSettings) -> HandlerRecovery:
        """``KIND`` or ``KIND:ATTEMPTS`` (the CLI's ``--on-failure``); None: the settings' default."""
        if isinstance(spec, HandlerRecovery):
            return spec
        kind, sep, n = (spec or settings.handler_recovery).partition(":")
        try:
            attempts = int(n) if sep else None
        except ValueError:
            raise ConfigurationError(f"handler recovery attempts must be a number, got {n!r}") from None
        return cls(kind, attempts)  # type: ignore[arg-type]

    def tries(self, settings: ProjectionSettings) -> int:
        return 1 if self.kind == "fail" else self.attempts or settings.handler_attempts

    @property
    def isolates(self) -> bool:
        """True when a failing event is set aside (skipped or dead-lettered) and the rest goes on."""
        return self.kind in ("retry-and-skip", "retry-and-dead-letter", "retry-and-dead-letter-sequenced")

    @property
    def dead_letters(self) -> bool:
        """True when a failing event is kept in ``projection_dead_letter``."""
        return self.kind in ("retry-and-dead-letter", "retry-and-dead-letter-sequenced")

    @property
    def sequenced(self) -> bool:
        """True when the later events of a dead letter's persistence id are parked behind it."""
        return self.kind == "retry-and-dead-letter-sequenced"


class Failures:
    """The handler failures of one event (or batch) so far: what a dead letter records."""

    __slots__ = ("attempts", "error", "first", "last")

    def __init__(self) -> None:
        self.attempts = 0
        self.error: BaseException | None = None
        self.first: datetime | None = None
        self.last: datetime | None = None

    def failed(self, error: BaseException) -> None:
        now = datetime.now(UTC)
        self.attempts += 1
        self.error = error
        self.first = self.first or now
        self.last = now

    @property
    def message(self) -> str:
        e = self.error
        return "unknown error" if e is None else f"{type(e).__name__}: {e}"

    @property
    def traceback(self) -> str:
        e = self.error
        return "" if e is None else "".join(traceback.format_exception(e))
