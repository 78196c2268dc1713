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
    parked: int = 0
    """Events parked behind a dead letter of their persistence id under
    ``retry-and-dead-letter-sequenced`` (not handled; their offsets stored)."""
    batches: int = 0
    last_event_timestamp: datetime | None = None
    last_commit: float = field(default_factory=time.monotonic)
    lags: dict[str, float] = field(default_factory=dict)
    """Per range of work (a slice range, a tag): wall time between the newest event's db_timestamp
    and the commit of its offset (last batch), or behind the query's position when caught up."""

    @property
    def lag_seconds(self) -> float:
        """The largest lag of this worker's ranges (0 before any batch)."""
        return max(self.lags.values(), default=0.0)

    def committed(self, n: int, newest: datetime | None, seconds: float | None = None, *, key: str = "") -> None:
        """A batch of ``n`` envelopes of range ``key`` committed; ``seconds``: how long handling and
        commit took."""
        self.events += n
        self.batches += 1
        self.last_commit = time.monotonic()
        if newest is not None:
            self.last_event_timestamp = newest
            self.lags[key] = max(0.0, (datetime.now(UTC) - newest).total_seconds())
        metrics.batch_committed(self.projection, n, seconds)

    def caught_up(self, key: str, upto: datetime) -> None:
        """Range ``key`` has delivered every event below ``upto`` (a query heartbeat) and has
        nothing left: its lag is how far ``upto`` is behind now, not the age of its last event
        (an idle range would otherwise show a lag that grows for ever)."""
        self.lags[key] = max(0.0, (datetime.now(UTC) - upto).total_seconds())
