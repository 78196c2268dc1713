"""Prometheus metrics of the write path (prometheus-client, the process-wide default registry).

One timing wrapper around the backend's ``write_batch``: it records per batch (not per event),
so the cost is a few microseconds per statement. A service exposes these with
``prometheus_client.start_http_server(port)``, or ``projections run --metrics-port`` does it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator

from prometheus_client import Counter, Histogram

from .errors import JournalUnavailable
from .write_batch import BatchResult, WriteBatch, WriteFn

ChunksFn = Callable[[Iterator[WriteBatch]], Awaitable[list[BatchResult]]]

WRITE_BATCH_EVENTS = Histogram(
    "journal_write_batch_events",
    "Events per group-commit write statement.",
    buckets=(1, 5, 10, 50, 100, 250, 500, 1000, 2000, 5000, 10000),
)
WRITE_BATCH_CALLS = Histogram(
    "journal_write_batch_calls",
    "persist calls coalesced into one group-commit write statement.",
    buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2000),
)
WRITE_SECONDS = Histogram(
    "journal_write_batch_seconds",
    "Latency of one group-commit write (statement, commit and any resolution of its outcome).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
EVENTS_WRITTEN = Counter("journal_events_written", "Events committed by persist calls.")
WRITES_FAILED = Counter("journal_writes_failed", "persist calls that failed (any error).", ["error"])
WRITES_OUTCOME_UNKNOWN = Counter(
    "journal_writes_outcome_unknown",
    "persist calls that failed with JournalUnavailable(outcome_unknown=True): may or may not be stored.",
)


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
    WRITE_SECONDS.observe(seconds)
    WRITE_BATCH_CALLS.observe(len(batch))
    written = total = batch.events
    for i, error in result.errors.items():  # the common case: none
        record_failure(error)
        written -= batch.counts[i]
    WRITE_BATCH_EVENTS.observe(total)
    EVENTS_WRITTEN.inc(written)


def record_failure(error: BaseException) -> None:
    """Count one failed persist call (and an unknown outcome separately)."""
    if isinstance(error, JournalUnavailable) and error.outcome_unknown:
        WRITES_OUTCOME_UNKNOWN.inc()
    WRITES_FAILED.labels(type(error).__name__).inc()
