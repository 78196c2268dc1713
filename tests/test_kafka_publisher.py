"""Events out to Kafka on a real broker: each event exactly once and each persistence id's events
in seq_nr order after a worker process is SIGKILLed between the Kafka commit and the offsets'
commit, and restarted; the same test finds duplicates when the offsets are not in the Kafka
transaction (at-least-once mode)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest
from kafka_fixtures import create_topic, read_topic

from journal import Journal

pytestmark = pytest.mark.kafka

PIDS, EVENTS = 40, 25


def run_worker(dsn: str, bootstrap: str, topic: str, mode: str, crash: int) -> int:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.kafka_worker", dsn, bootstrap, topic, mode, str(crash)],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode in (0, -9), proc.stderr[-3000:]
    return proc.returncode


@pytest.mark.parametrize("mode", ["exactly-once", "at-least-once"])
async def test_sigkill_between_kafka_and_offsets_then_restart(
    journal: Journal, dsn: str, kafka_bootstrap: str, mode: str
) -> None:
    for i in range(EVENTS):
        for p in range(PIDS):
            await journal.persist(f"acct|{p}", [{"n": i, "pid": p}])
    topic = create_topic(kafka_bootstrap, partitions=4)

    assert run_worker(dsn, kafka_bootstrap, topic, mode, crash=1) == -9  # killed after its first batch
    assert run_worker(dsn, kafka_bootstrap, topic, mode, crash=0) == 0

    records = read_topic(kafka_bootstrap, topic)
    seen = Counter((h["pid"].decode(), int(h["seq_nr"])) for _, _, _, h in records)
    expected = {(f"acct|{p}", s) for p in range(PIDS) for s in range(1, EVENTS + 1)}
    assert set(seen) == expected
    duplicates = sum(n - 1 for n in seen.values())
    if mode == "at-least-once":  # the offsets outside the Kafka transaction: the killed batch again
        assert duplicates > 0
        return
    assert duplicates == 0
    by_pid: dict[str, list[int]] = {}
    for _, key, value, h in records:
        assert key == h["pid"] and value is not None
        by_pid.setdefault(h["pid"].decode(), []).append(int(h["seq_nr"]))
        assert set(h) == {"pid", "seq_nr", "slice", "db_timestamp", "manifest"}
    assert all(seqs == list(range(1, EVENTS + 1)) for seqs in by_pid.values())
