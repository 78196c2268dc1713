"""Counters a worker keeps for its progress display, ``projections status`` and the metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from . import metrics


@dataclass
class Stats:
    projection: str = ""
    """The projection these counters belong to (the label of its batch metrics)."""
    events: int = 0
    """Envelopes handled and committed."""
    duplicates: int = 0
    """Envelopes skipped as already processed."""
    replayed: int = 0
    """Envelopes fetched by persistence id to fill a gap."""
    retries: int = 0
    """Batch attempts that failed (handler or commit error) and were rolled back."""
    skipped: int = 0
    """Events a failing handler gave up on under ``retry-and-skip`` (the offset moved past them)."""
    dead_lettered: int = 0
    """Events parked in the dead-letter table under ``retry-and-dead-letter``."""
    batches: int = 0
    last_event_timestamp: datetime | None = None
    last_commit: float = field(default_factory=time.monotonic)
    lag_seconds: float = 0.0
    """Wall time between an event's db_timestamp and the commit of its offset (last batch)."""

    def committed(self, n: int, newest: datetime | None, seconds: float | None = None) -> None:
        """A batch of ``n`` envelopes committed; ``seconds``: how long handling and commit took."""
        self.events += n
        self.batches += 1
        self.last_commit = time.monotonic()
        if newest is not None:
            self.last_event_timestamp = newest
            self.lag_seconds = max(0.0, (datetime.now(UTC) - newest).total_seconds())
        metrics.batch_committed(self.projection, n, seconds)
