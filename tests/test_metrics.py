"""Metrics a user can scrape: a real worker process over HTTP, the journal's write metrics."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import asyncpg
import pytest
from projection_helpers import FAST_ENV, stop
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from journal import Journal, JournalUnavailable, SequenceConflict
from journal.metrics import instrumented
from journal.serialization import SerializerRegistry
from journal.write_batch import BatchResult, WriteBatch
from journal.write_validation import WriteValidator
from tests.metrics_handler import SETUP
from tests.support.waiting import wait_until

NAME, ENTITY_TYPE = "p-metrics", "MetricCart"
PIDS, PER_PID = 20, 10


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the worker's /metrics, keyed by name and sorted labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    return sum(v for (n, labels), v in samples.items() if n == name and ("projection", NAME) in labels)


def spawn(dsn: str, log: Path, states: bool) -> subprocess.Popen[bytes]:
    env = {
        **os.environ, **FAST_ENV,
        "JOURNAL_PROJECTION_HANDLER_ATTEMPTS": "100000", "JOURNAL_PROJECTION_HANDLER_MAX_BACKOFF": "0.1",
    }  # fmt: skip
    handler = ["--states", "--handler", "tests.metrics_handler:project_states"] if states else [
        "--handler", "tests.metrics_handler:project"]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "projections", "run", NAME, "--entity-type", ENTITY_TYPE, *handler,
         "--dsn", dsn, "--no-progress", "--metrics-port", "0", "--metrics-interval", "0.2"],
        env=env, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["events", "states"])
async def test_a_worker_process_serves_real_values(journal: Journal, dsn: str, tmp_path: Path, kind: str) -> None:
    """A worker (of events, or of durable states with ``--states``) whose handler fails until a
    gate opens: its lag is every event (every changed state) and handler failures count; once
    open, everything is processed and the lag is 0. Same metric names and labels for both."""
    conn = await asyncpg.connect(dsn)
    await conn.execute(SETUP)
    if kind == "states":  # each id at revision PER_PID: one change pending per id
        for r in range(1, PER_PID + 1):
            await journal.durable_state().upsert_many([(f"{ENTITY_TYPE}|{i}", r, {"n": r}) for i in range(PIDS)])
        written = PIDS
    else:
        for i in range(PIDS):
            await journal.persist(f"{ENTITY_TYPE}|{i}", [{"n": n} for n in range(PER_PID)])
        written = PIDS * PER_PID
    log = tmp_path / "worker.log"
    proc = spawn(dsn, log, kind == "states")
    try:

        async def port() -> int | None:
            found = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", log.read_text())
            assert proc.poll() is None, log.read_text()
            return int(found.group(1)) if found else None

        p = await wait_until(port, 60, "the worker's metrics address in its log")

        async def lagging() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            s = await asyncio.to_thread(scrape, p)
            full = total(s, "projection_lag_events") == written and total(s, "projection_lag_seconds") > 0
            return s if full and total(s, "projection_handler_failures_total") >= 1 else None

        s = await wait_until(lagging, 60, "the closed gate to show as lag and handler failures")
        assert total(s, "projection_events_processed_total") == 0
        assert total(s, "projection_leases_held") == 1024
        owned = [dict(labels)["slices"] for (n, labels), _ in s.items() if n == "projection_range_owned"]
        assert sum(int(r.split("-")[1]) - int(r.split("-")[0]) + 1 for r in owned) == 1024

        await conn.execute("UPDATE metrics_gate SET open = true")

        async def caught_up() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            s = await asyncio.to_thread(scrape, p)
            done = total(s, "projection_events_processed_total") == written and total(s, "projection_lag_events") == 0
            return s if done else None

        s = await wait_until(caught_up, 60, f"{written} events processed and no lag")
        assert await conn.fetchval("SELECT count(*) FROM metrics_projected") == written
        assert total(s, "projection_batch_events_sum") == written
        assert total(s, "projection_batch_seconds_count") >= 1
        assert total(s, "projection_lag_seconds") == 0
        assert total(s, "projection_worker_failed") == 0

        out = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "projections", "status", NAME, "--dsn", dsn, "--json"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        (status,) = json.loads(out.stdout)
        assert status["name"] == NAME
        assert sum(r["hi"] - r["lo"] + 1 for r in status["ranges"]) == 1024
        assert [w["state"] for w in status["workers"]] == ["running"]
        assert status["workers"][0]["live"] is True
    finally:
        stop([proc])
        await conn.close()


def _value(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def test_journal_write_metrics_count_what_was_written(journal: Journal) -> None:
    events, statements = _value("journal_events_written_total"), _value("journal_write_batch_calls_count")
    await asyncio.gather(*(journal.persist(f"m|{i}", [1, 2, 3]) for i in range(50)))
    assert _value("journal_events_written_total") - events == 150
    assert 1 <= _value("journal_write_batch_calls_count") - statements <= 50
    conflicts = _value("journal_writes_failed_total", {"error": "SequenceConflict"})
    with pytest.raises(SequenceConflict):
        await journal.persist("m|0", [4], expected_seq_nr=1)
    assert _value("journal_writes_failed_total", {"error": "SequenceConflict"}) - conflicts == 1
    assert _value("journal_events_written_total") - events == 150


async def test_unknown_outcomes_are_counted() -> None:
    async def interrupted(batch: WriteBatch) -> BatchResult:
        raise JournalUnavailable("connection lost after the statement was sent", outcome_unknown=True)

    before = _value("journal_writes_outcome_unknown_total")
    batch = WriteValidator(SerializerRegistry()).batch([(f"m|{i}", [i]) for i in range(2)])
    with pytest.raises(JournalUnavailable):
        await instrumented(interrupted)(batch)
    assert _value("journal_writes_outcome_unknown_total") - before == 2


async def test_bulk_writes_as_columns_are_counted(journal: Journal) -> None:
    from journal import Write, failures

    events, statements = _value("journal_events_written_total"), _value("journal_write_batch_calls_count")
    await journal.persist("mc|taken", ["a"])
    conflicts = _value("journal_writes_failed_total", {"error": "SequenceConflict"})
    out = await journal.persist_many([Write(f"mc|{i}", [i], 0) for i in range(30)] + [Write("mc|taken", ["b"], 0)])
    assert [i for i, _ in failures(out)] == [30]
    assert _value("journal_events_written_total") - events == 1 + 30
    assert _value("journal_write_batch_calls_count") - statements >= 2
    assert _value("journal_writes_failed_total", {"error": "SequenceConflict"}) - conflicts == 1
