"""``projections run NAME --to-kafka TOPIC``: the real command publishes every event once; bad
input fails in one line with exit code 2 before anything starts."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from kafka_fixtures import create_topic, read_topic
from projection_helpers import FAST_ENV

from journal import Journal
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka


def projections(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "projections", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_a_missing_topic_is_one_line(dsn: str, kafka_bootstrap: str) -> None:
    out = projections("run", "kp", "--entity-type", "acct", "--to-kafka", "no-such-topic",
                      "--kafka-bootstrap", kafka_bootstrap, "--dsn", dsn, "--no-progress")  # fmt: skip
    assert (out.returncode, out.stderr.strip()) == (
        2, "error: the Kafka topic 'no-such-topic' does not exist (create it first)"
    )  # fmt: skip


def test_handler_or_topic_exactly_one(dsn: str) -> None:
    out = projections("run", "kp", "--entity-type", "acct", "--dsn", dsn)
    assert (out.returncode, out.stderr.strip()) == (2, "error: give exactly one of --handler and --to-kafka")
    out = projections("run", "kp", "--tag", "t", "--to-kafka", "x", "--dsn", dsn)
    assert out.returncode == 2 and "grouped mode (no --tag, no --mode)" in out.stderr


def test_a_bad_kafka_settings_file_is_one_line(dsn: str, tmp_path: Path) -> None:
    """--kafka-config: a file that cannot be read, a line that is not key=value, a setting
    librdkafka does not know: one line naming it, exit 2, before anything connects."""
    pytest.importorskip("confluent_kafka")
    bad_line, unknown = tmp_path / "bad-line", tmp_path / "unknown"
    bad_line.write_text("# a login\nsecurity.protocol=SASL_PLAINTEXT\nsasl.password\n")
    unknown.write_text("no.such.setting=1\n")
    said = {}
    for path in (tmp_path / "missing", bad_line, unknown):
        out = projections("run", "kp", "--entity-type", "acct", "--to-kafka", "t", "--kafka-config", str(path),
                          "--kafka-bootstrap", "127.0.0.1:9", "--dsn", dsn, "--no-progress")  # fmt: skip
        assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
        said[path.name] = out.stderr.strip()
    assert said["missing"].startswith(f"error: cannot read the Kafka settings file '{tmp_path / 'missing'}': ")
    assert said["bad-line"] == f"error: {bad_line}: line 3 is not key=value"
    assert said["unknown"] == 'error: Kafka client settings: No such configuration property: "no.such.setting"'


async def test_the_command_publishes_every_event_once(journal: Journal, dsn: str, kafka_bootstrap: str) -> None:
    for i in range(20):
        for p in range(10):
            await journal.persist(f"acct|{p}", [{"n": i}])
    topic = create_topic(kafka_bootstrap)
    records = await asyncio.to_thread(run_until_published, dsn, kafka_bootstrap, topic, 200)
    assert sorted((h["pid"], int(h["seq_nr"])) for *_, h in records) == sorted(
        (f"acct|{p}".encode(), s) for p in range(10) for s in range(1, 21)
    )


def run_until_published(
    dsn: str, bootstrap: str, topic: str, n: int, *extra: str, env: dict[str, str] | None = None
) -> list[tuple[int, bytes | None, bytes | None, dict[str, bytes]]]:
    """Run projection ``kp-<topic>`` until ``topic`` holds ``n`` records, stop it (SIGTERM), read
    the topic (each test's projection its own: the tests share the database's offset tables)."""
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [sys.executable, "-m", "projections", "run", f"kp-{topic}", "--entity-type", "acct", "--to-kafka", topic,
         "--kafka-bootstrap", bootstrap, "--dsn", dsn, "--no-progress", *extra],
        env={**os.environ, **FAST_ENV, **(env or {})}, stdout=subprocess.DEVNULL, stderr=err,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(read_topic(bootstrap, topic)) < n:
            assert proc.poll() is None and time.monotonic() < deadline
    except BaseException:
        proc.kill()
        raise
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(30)
    err.seek(0)
    assert code == 0, err.read().decode()[-3000:]
    return read_topic(bootstrap, topic)


async def test_a_batch_is_5000_events_unless_the_environment_says(
    journal: Journal, dsn: str, kafka_bootstrap: str
) -> None:
    """A batch is one Kafka transaction, and the offsets topic gets one row per id a batch: the
    command's default (``projections.kafka.GROUP_SIZE``) makes one id's 6,000 events two batches
    (at most four: a batch closes early when its events come slowly), while
    JOURNAL_PROJECTION_GROUP_SIZE=1000 makes at least six."""
    await journal.persist("acct|many", [{"n": i} for i in range(6000)])
    total = len([e async for e in journal.current_events_by_slices("acct", 0, 1023)])
    batches = []
    for env in ({}, {"JOURNAL_PROJECTION_GROUP_SIZE": "1000"}):
        topic = create_topic(kafka_bootstrap)
        records = await asyncio.to_thread(run_until_published, dsn, kafka_bootstrap, topic, total, env=env)
        assert sorted(int(h["seq_nr"]) for _, key, _, h in records if key == b"acct|many") == list(range(1, 6001))
        offsets = await asyncio.to_thread(read_topic, kafka_bootstrap, f"sj-offsets.kp-{topic}")
        batches.append(sum(1 for _, key, _, _ in offsets if key == b"acct|many"))
    assert batches[0] <= 4 and batches[1] >= 6, batches


async def test_a_record_over_the_size_limit_is_dead_lettered(journal: Journal, dsn: str, kafka_bootstrap: str) -> None:
    """The broker refuses one record (the topic's max.message.bytes): under retry-and-dead-letter
    that event is parked with the broker's reason, every other event is published once."""
    for i in range(5):
        for p in range(10):
            big = p == 3 and i == 2
            await journal.persist(f"acct|{p}", [{"n": i, "pad": "x" * (5000 if big else 10)}])
    topic = create_topic(kafka_bootstrap, **{"max.message.bytes": "2000"})
    records = await asyncio.to_thread(
        run_until_published, dsn, kafka_bootstrap, topic, 49, "--on-failure", "retry-and-dead-letter:2"
    )
    expected = sorted((f"acct|{p}".encode(), s) for p in range(10) for s in range(1, 6) if (p, s) != (3, 3))
    assert sorted((h["pid"], int(h["seq_nr"])) for *_, h in records) == expected
    out = projections("dead-letters", "list", f"kp-{topic}", "--dsn", dsn)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == f"1 dead letters of kp-{topic}" and lines[0].startswith("acct|3 #3 "), out.stdout
    assert "too large" in lines[0].lower(), lines[0]


def start_worker(dsn: str, bootstrap: str, topic: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "projections", "run", f"kp-{topic}", "--entity-type", "acct", "--to-kafka",
         topic, "--kafka-bootstrap", bootstrap, "--dsn", dsn, "--no-progress"],
        env={**os.environ, **FAST_ENV, "JOURNAL_PROJECTION_GROUP_SIZE": "1000"},  # the rescale comes mid-run
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def test_rescale_1_4_2_publishes_every_event_once(journal: Journal, dsn: str, kafka_bootstrap: str) -> None:
    """One worker; three more once a quarter is published (all four owning slices); two of them
    stopped (SIGTERM: commit, release) once half is; the last two publish the rest."""
    from test_kafka_publisher import high_watermark

    from projections.postgres_store import ProjectionSql

    pids, events = 200, 30
    total = pids * events
    for p in range(pids):
        await journal.persist(f"acct|{p}", [{"n": i} for i in range(events)])
    topic = create_topic(kafka_bootstrap)
    name, leases = f"kp-{topic}", ProjectionSql("public").leases

    async def published(n: int) -> bool:
        return await asyncio.to_thread(high_watermark, kafka_bootstrap, topic) >= n

    async def owners(n: int) -> bool:
        async with journal.backend.shared_connections().pool.acquire() as conn:
            rows = await leases.lease_owners(conn, name)
        return len({r["owner"] for r in rows if r["live"]}) == n

    procs = [await asyncio.to_thread(start_worker, dsn, kafka_bootstrap, topic)]
    try:
        await wait_until(lambda: published(total // 4), 120, "a quarter published")
        procs += [await asyncio.to_thread(start_worker, dsn, kafka_bootstrap, topic) for _ in range(3)]
        await wait_until(lambda: owners(4), 60, "four workers owning slices")
        await wait_until(lambda: published(total // 2), 120, "half published")
        for p in procs[:2]:
            p.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(p.wait, 60) == 0
        await wait_until(lambda: owners(2), 60, "two workers owning slices")

        async def all_published() -> bool:
            return len(await asyncio.to_thread(read_topic, kafka_bootstrap, topic)) >= total

        await wait_until(all_published, 120, "every event published")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            await asyncio.to_thread(p.wait, 60)

    by_pid: dict[str, list[int]] = {}
    for *_, h in read_topic(kafka_bootstrap, topic):
        by_pid.setdefault(h["pid"].decode(), []).append(int(h["seq_nr"]))
    assert by_pid == {f"acct|{p}": list(range(1, events + 1)) for p in range(pids)}
