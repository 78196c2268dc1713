"""Prometheus metrics of projection workers (prometheus-client, the process-wide default registry).

Counters and lease ownership are read from the live workers when Prometheus scrapes (no cost on
the hot path); batch sizes and durations are observed once per committed batch; the lag of each
owned slice range (seconds and events) is sampled from the database by :class:`LagSampler`.
``projections run --metrics-port`` serves all of it; from Python, :func:`serve` does.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any, Protocol

from prometheus_client import REGISTRY, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from journal.errors import ConfigurationError
from journal.waits import wait_set

log = logging.getLogger("projections.metrics")

BATCH_EVENTS = Histogram(
    "projection_batch_events",
    "Envelopes per committed projection batch.",
    ["projection"],
    buckets=(0, 1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000),
)
BATCH_SECONDS = Histogram(
    "projection_batch_seconds",
    "Time to handle a batch and commit it with its offsets (retries included).",
    ["projection"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)


def batch_committed(projection: str, events: int, seconds: float | None) -> None:
    """Observe one committed batch (called by :class:`projections.stats.Stats`)."""
    BATCH_EVENTS.labels(projection).observe(events)
    if seconds is not None:
        BATCH_SECONDS.labels(projection).observe(seconds)


class _SliceOffsets(Protocol):
    latest: datetime | None


class _Validator(Protocol):
    @property
    def slices(self) -> dict[int, Any]: ...


class _Processor(Protocol):
    validator: _Validator


class _Counters(Protocol):
    """What the metrics read of a worker's :class:`projections.stats.Stats`."""

    events: int
    duplicates: int
    replayed: int
    retries: int
    skipped: int
    dead_lettered: int
    parked: int


class TrackedWorker(Protocol):
    """What the metrics read of a worker (``projections.Worker`` and ``TagWorker``)."""

    name: str
    worker_id: str
    entity_type: str
    lag_by_slice: bool
    """False for a tag projection (one lease for the tag): its lag is not measured by slice."""
    lag_counts_states: bool
    """True for a state projection: its lag counts the states changed after its offsets."""
    epochs: dict[int, int]
    error: str | None

    @property
    def stats(self) -> _Counters: ...

    @property
    def processors(self) -> dict[tuple[int, int], tuple[Any, asyncio.Task[None]]]: ...


_workers: weakref.WeakSet[Any] = weakref.WeakSet()
_lags: dict[tuple[str, str], tuple[float, int]] = {}
"""(projection, "lo-hi") -> (lag seconds, lag events), written by the samplers."""


def track(worker: TrackedWorker) -> None:
    """Export this worker's counters while it exists (workers call this when created)."""
    _workers.add(worker)


def _ranges(worker: TrackedWorker) -> list[tuple[int, int]]:
    return sorted(dict(worker.processors))


class WorkerCollector(Collector):
    """Reads the tracked workers' state at scrape time."""

    def collect(self) -> Iterator[Any]:
        labels = ["projection", "worker"]
        events = CounterMetricFamily("projection_events_processed", "Envelopes handled and committed.", labels=labels)
        dups = CounterMetricFamily(
            "projection_duplicates_skipped", "Envelopes skipped as already processed.", labels=labels
        )
        replayed = CounterMetricFamily(
            "projection_events_replayed", "Envelopes fetched by persistence id to fill a gap.", labels=labels
        )
        failures = CounterMetricFamily(
            "projection_handler_failures", "Batch attempts that failed and were rolled back.", labels=labels
        )
        skipped = CounterMetricFamily(
            "projection_events_skipped", "Events a failing handler gave up on (retry-and-skip).", labels=labels
        )
        dead = CounterMetricFamily(
            "projection_dead_letters", "Events parked in the dead-letter table (retry-and-dead-letter).",
            labels=labels,
        )  # fmt: skip
        parked = CounterMetricFamily(
            "projection_events_parked", "Events parked behind a dead letter (retry-and-dead-letter-sequenced).",
            labels=labels,
        )  # fmt: skip
        failed = GaugeMetricFamily("projection_worker_failed", "1 when the worker stopped on an error.", labels=labels)
        leases = GaugeMetricFamily("projection_leases_held", "Slice leases this worker holds.", labels=labels)
        owned = GaugeMetricFamily(
            "projection_range_owned", "1 per slice range this worker is processing.", labels=[*labels, "slices"]
        )
        lag_s = GaugeMetricFamily(
            "projection_lag_seconds", "Age of the oldest event not yet processed (0 when caught up).",
            labels=["projection", "slices"],
        )  # fmt: skip
        lag_n = GaugeMetricFamily(
            "projection_lag_events",
            "Events (a state projection: changed states) not yet processed (counted up to a cap per slice).",
            labels=["projection", "slices"],
        )  # fmt: skip
        for w in list(_workers):
            key = [w.name, w.worker_id]
            st = w.stats
            events.add_metric(key, st.events)
            dups.add_metric(key, st.duplicates)
            replayed.add_metric(key, st.replayed)
            failures.add_metric(key, st.retries)
            skipped.add_metric(key, st.skipped)
            dead.add_metric(key, st.dead_lettered)
            parked.add_metric(key, st.parked)
            failed.add_metric(key, 1.0 if w.error else 0.0)
            leases.add_metric(key, len(w.epochs))
            for lo, hi in _ranges(w):
                slices = f"{lo}-{hi}"
                owned.add_metric([*key, slices], 1.0)
                lag = _lags.get((w.name, slices))
                if lag is not None:
                    lag_s.add_metric([w.name, slices], lag[0])
                    lag_n.add_metric([w.name, slices], lag[1])
        yield from (events, dups, replayed, failures, skipped, dead, parked, failed, leases, owned, lag_s, lag_n)


REGISTRY.register(WorkerCollector())


class LagSampler:
    """Every ``interval`` seconds, measures the lag of each slice range the workers process:
    events after each slice's offset (up to ``cap`` per slice) and the oldest one's age."""

    def __init__(self, workers: Iterable[TrackedWorker], pool: Any, schema: str, *, interval: float = 5.0,
                 cap: int = 100_000) -> None:  # fmt: skip
        from .postgres_store import ProjectionSql

        self.workers = list(workers)
        self.pool = pool
        """The journal's (:meth:`journal.backend.Backend.shared_connections`): one pool per process."""
        self.sql = ProjectionSql(schema)
        self.interval = interval
        self.cap = cap
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        import asyncpg

        while not self._stop.is_set():
            try:
                async with self.pool.acquire() as conn:
                    await self.sample(conn)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
                log.warning("lag sample failed (will retry): %s", e)
            await wait_set(self._stop, self.interval)

    async def sample(self, conn: Any) -> None:
        """One measurement of every range the workers process now."""
        seen: set[tuple[str, str]] = set()
        for w in self.workers:
            if not w.lag_by_slice:
                continue
            for (lo, hi), (proc, _) in list(w.processors.items()):
                offsets: dict[int, datetime | None] = {}
                for s in range(lo, hi + 1):
                    state = proc.validator.slices.get(s)
                    offsets[s] = state.latest if state is not None else None
                pending_of = self.sql.pending_states if w.lag_counts_states else self.sql.pending_events
                pending, oldest, now = await pending_of(conn, w.entity_type, offsets, self.cap)
                key = (w.name, f"{lo}-{hi}")
                seconds = max(0.0, (now - oldest).total_seconds()) if oldest is not None and pending else 0.0
                _lags[key] = (seconds, pending)
                seen.add(key)
        names = {w.name for w in self.workers}
        for key in [k for k in _lags if k[0] in names and k not in seen]:
            del _lags[key]


def serve(port: int, addr: str = "127.0.0.1") -> int:
    """Serve every metric of this process (journal and projections) at ``http://addr:port/metrics``
    in a daemon thread; ``port`` 0 picks a free port. Returns the port.

    Raises ConfigurationError when the address cannot be bound (the port is in use)."""
    try:
        server, _ = start_http_server(port, addr)
    except OSError as e:
        raise ConfigurationError(f"cannot serve metrics on {addr}:{port}: {e.strerror or e}") from e
    return int(server.server_port)
