"""Prometheus metrics of the write path (prometheus-client, the process-wide default registry).

One timing wrapper around the backend's ``write_batch``: it records per batch (not per event),
so the cost is a few microseconds per statement. A service exposes these with
``prometheus_client.start_http_server(port)``, or ``projections run --metrics-port`` does it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime

from prometheus_client import Counter, Histogram

from .backend import WriteRequest, WriteResult
from .columns import WriteColumns
from .errors import JournalUnavailable

WriteBatch = Callable[[Sequence[WriteRequest]], Awaitable[list[WriteResult | Exception]]]
WriteColumnsFn = Callable[[WriteColumns], Awaitable[datetime | list[WriteResult | Exception]]]

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


def instrumented(write_batch: WriteBatch) -> WriteBatch:
    """``write_batch`` that records batch size, latency, events written and failures."""

    async def timed(requests: Sequence[WriteRequest]) -> list[WriteResult | Exception]:
        started = time.perf_counter()
        try:
            results = await write_batch(requests)
        except Exception as e:
            for _ in requests:
                record_failure(e)
            raise
        WRITE_SECONDS.observe(time.perf_counter() - started)
        WRITE_BATCH_CALLS.observe(len(requests))
        total = sum([len(r.events) for r in requests])
        written = total
        if not all([type(x) is WriteResult for x in results]):  # the common case: all written
            for request, result in zip(requests, results, strict=True):
                if isinstance(result, Exception):
                    record_failure(result)
                    written -= len(request.events)
        WRITE_BATCH_EVENTS.observe(total)
        EVENTS_WRITTEN.inc(written)
        return results

    return timed


def instrumented_columns(write_columns: WriteColumnsFn) -> WriteColumnsFn:
    """``write_columns`` recording what :func:`instrumented` records for a batch."""

    async def timed(columns: WriteColumns) -> datetime | list[WriteResult | Exception]:
        started = time.perf_counter()
        n = len(columns)
        try:
            got = await write_columns(columns)
        except Exception as e:
            for _ in range(n):
                record_failure(e)
            raise
        WRITE_SECONDS.observe(time.perf_counter() - started)
        WRITE_BATCH_CALLS.observe(n)
        WRITE_BATCH_EVENTS.observe(n)
        written = n
        if not isinstance(got, datetime):
            for result in got:
                if isinstance(result, Exception):
                    record_failure(result)
                    written -= 1
        EVENTS_WRITTEN.inc(written)
        return got

    return timed


def record_failure(error: BaseException) -> None:
    """Count one failed persist call (and an unknown outcome separately)."""
    if isinstance(error, JournalUnavailable) and error.outcome_unknown:
        WRITES_OUTCOME_UNKNOWN.inc()
    WRITES_FAILED.labels(type(error).__name__).inc()
