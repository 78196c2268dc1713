"""Prometheus metrics of the write path (prometheus-client, the process-wide default registry).

One timing wrapper around the backend's ``write_batch``: it records per batch (not per event).
The figures are plain numbers the write path adds to (a bucket found by bisection, a sum, a
count: no lock, no object per observation), and a collector registered once turns them into
metric families when the registry is scraped: recording a batch costs well under a microsecond,
which a lone ``persist`` would otherwise spend several times over in the client's locks (the
additions are exact within one thread, which is how a journal is used: from its event loop). A
service exposes these with ``prometheus_client.start_http_server(port)``, or ``projections run
--metrics-port`` does it.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator
from itertools import accumulate

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from .errors import JournalUnavailable
from .write_batch import BatchResult, WriteBatch, WriteFn, WriteLater, deferrals

ChunksFn = Callable[[Iterator[WriteBatch]], Awaitable[list[BatchResult]]]


class Tally:
    """A histogram's figures: a count per bucket (the last: above every bound) and the sum."""

    def __init__(self, name: str, documentation: str, bounds: tuple[float, ...]) -> None:
        self.name, self.documentation, self.bounds = name, documentation, bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def family(self) -> Metric:
        les = [*map(floatToGoString, self.bounds), "+Inf"]
        cumulative = list(accumulate(self.counts))
        return HistogramMetricFamily(
            self.name, self.documentation, buckets=list(zip(les, cumulative, strict=True)), sum_value=self.sum
        )


WRITE_BATCH_EVENTS = Tally(
    "journal_write_batch_events", "Events per group-commit write statement.",
    (1, 5, 10, 50, 100, 250, 500, 1000, 2000, 5000, 10000),
)  # fmt: skip
WRITE_BATCH_CALLS = Tally(
    "journal_write_batch_calls", "persist calls coalesced into one group-commit write statement.",
    (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2000),
)  # fmt: skip
WRITE_SECONDS = Tally(
    "journal_write_batch_seconds",
    "Latency of one group-commit write (statement, commit and any resolution of its outcome).",
    (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
EVENTS_WRITTEN = [0]
"""Events committed by persist calls (a one-element list: added to in place)."""
WRITES_FAILED: dict[str, int] = {}
"""persist calls that failed, by error type."""
WRITES_OUTCOME_UNKNOWN = [0]
"""persist calls that failed with JournalUnavailable(outcome_unknown=True)."""


class _WriteMetrics:
    """The collector that reads the figures above when the registry is scraped."""

    def collect(self) -> Iterator[Metric]:
        for tally in (WRITE_BATCH_EVENTS, WRITE_BATCH_CALLS, WRITE_SECONDS):
            yield tally.family()
        yield CounterMetricFamily("journal_events_written", "Events committed by persist calls.", EVENTS_WRITTEN[0])
        failed = CounterMetricFamily(
            "journal_writes_failed", "persist calls that failed (any error).", labels=["error"]
        )
        for error, n in sorted(WRITES_FAILED.items()):
            failed.add_metric([error], n)
        yield failed
        yield CounterMetricFamily(
            "journal_writes_outcome_unknown",
            "persist calls that failed with JournalUnavailable(outcome_unknown=True): may or may not be stored.",
            WRITES_OUTCOME_UNKNOWN[0],
        )


REGISTRY.register(_WriteMetrics())  # type: ignore[arg-type]  # a collector is anything with collect()


def instrumented(write_batch: WriteFn) -> WriteFn:
    """``write_batch`` that records batch size, latency, events written and failures."""

    async def timed(batch: WriteBatch) -> BatchResult:
        started = time.perf_counter()
        try:
            result = await write_batch(batch)
        except Exception as e:
            for _ in range(len(batch)):
                record_failure(e)
            raise
        record(batch, result, time.perf_counter() - started)
        return result

    return timed


def _count_later(batch: WriteBatch, result: BatchResult, started: float) -> None:
    """Calls a result defers (:class:`~journal.write_batch.WriteLater`) are recorded when they
    are finished, not as failures."""
    for later in deferrals(result):
        _time_later(later, batch.select(later.calls), started)


def _time_later(later: WriteLater, calls: WriteBatch, started: float) -> None:
    finish = later.finish

    async def timed() -> BatchResult:
        got = await finish()
        record(calls, got, time.perf_counter() - started)
        return got

    later.finish = timed


def instrumented_chunks(write_chunks: ChunksFn) -> ChunksFn:
    """``write_chunks`` recording what :func:`instrumented` records, for each chunk (its latency:
    the whole bulk write's, as its chunks commit together)."""

    async def timed(chunks: Iterator[WriteBatch]) -> list[BatchResult]:
        started = time.perf_counter()
        taken: list[WriteBatch] = []

        def counted() -> Iterator[WriteBatch]:
            for c in chunks:
                taken.append(c)
                yield c

        results = await write_chunks(counted())
        seconds = time.perf_counter() - started
        for batch, result in zip(taken, results, strict=True):
            record(batch, result, seconds)
        return results

    return timed


def record(batch: WriteBatch, result: BatchResult, seconds: float) -> None:
    """Record one written batch."""
    if result.errors:
        _count_later(batch, result, time.perf_counter() - seconds)
    WRITE_SECONDS.observe(seconds)
    WRITE_BATCH_CALLS.observe(len(batch))
    written = total = batch.events
    for i, error in result.errors.items():  # the common case: none
        written -= batch.counts[i]
        if type(error) is WriteLater:
            total -= batch.counts[i]
            continue
        record_failure(error)
    WRITE_BATCH_EVENTS.observe(total)
    EVENTS_WRITTEN[0] += written


def record_failure(error: BaseException) -> None:
    """Count one failed persist call (and an unknown outcome separately)."""
    if isinstance(error, JournalUnavailable) and error.outcome_unknown:
        WRITES_OUTCOME_UNKNOWN[0] += 1
    name = type(error).__name__
    WRITES_FAILED[name] = WRITES_FAILED.get(name, 0) + 1
