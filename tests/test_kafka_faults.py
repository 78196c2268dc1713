"""Faults of the broker under a publishing worker, on a real broker of the test's own (it is
restarted, or reached through a relay that cuts the network): afterwards a read_committed
consumer of the whole topic sees every event exactly once and each persistence id's events in
seq_nr order."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka_fixtures import create_topic, read_topic, running, skip_or_fail

from journal import Journal
from tests.support.relay import Relay
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kafka


@pytest.fixture
def own_broker() -> Iterator[object]:
    """A broker of this test alone (the session's one is shared: it is not restarted)."""
    pytest.importorskip("confluent_kafka")
    from projections.kafka.local import LocalKafka

    with running(LocalKafka()) as broker:
        yield broker


def records_so_far(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in range(4))
    finally:
        consumer.close()


def publish_across_a_restart(dsn: str, broker: object, topic: str, mark: int) -> tuple[int, str]:
    """A worker publishes; once the topic holds ``mark`` records the broker is SIGKILLed and
    started again; the worker's exit code and stderr's tail."""
    from projections.kafka.local import LocalKafka

    assert isinstance(broker, LocalKafka)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.kafka_worker", dsn, broker.bootstrap_servers, topic, "exactly-once", "none"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while records_so_far(broker.bootstrap_servers, topic) < mark:
        assert proc.poll() is None and time.monotonic() < deadline, f"the worker ended before {mark} records"
    broker.restart(kill=True)
    assert proc.poll() is None, "the worker finished before the broker restarted: the test tested nothing"
    _, err = proc.communicate(timeout=240)
    return proc.returncode, err[-3000:]


async def test_a_broker_restart_while_publishing(journal: Journal, dsn: str, own_broker: object) -> None:
    from projections.kafka.local import LocalKafka

    assert isinstance(own_broker, LocalKafka)
    pids, events = 100, 60
    for p in range(pids):
        await journal.persist(f"acct|{p}", [{"n": i} for i in range(events)])
    topic = create_topic(own_broker.bootstrap_servers, partitions=4)
    code, err = await asyncio.to_thread(publish_across_a_restart, dsn, own_broker, topic, 1500)
    assert code == 0, err

    by_pid: dict[str, list[int]] = {}
    for _, _, _, h in read_topic(own_broker.bootstrap_servers, topic):
        by_pid.setdefault(h["pid"].decode(), []).append(int(h["seq_nr"]))
    assert by_pid == {f"acct|{p}": list(range(1, events + 1)) for p in range(pids)}


def start_worker(dsn: str, bootstrap: str, topic: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.kafka_worker", dsn, bootstrap, topic, "exactly-once", "none"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def wait_for_records(bootstrap: str, topic: str, proc: subprocess.Popen[Any], mark: int) -> None:
    deadline = time.monotonic() + 120
    while records_so_far(bootstrap, topic) < mark:
        assert proc.poll() is None and time.monotonic() < deadline, f"the worker ended before {mark} records"


async def test_a_cut_network_between_the_worker_and_the_broker(journal: Journal, dsn: str) -> None:
    """Every client reaches the broker through a relay (the broker advertises the relay's port);
    while a worker publishes, the relay throws the broker's answers away and cuts every
    connection for 5 s (the broker may have done what it was asked: a commit may have committed),
    then lets traffic through again."""
    pytest.importorskip("confluent_kafka")
    from journal.errors import KafkaSetupError
    from projections.kafka.local import LocalKafka

    pids, events = 100, 60
    for p in range(pids):
        await journal.persist(f"acct|{p}", [{"n": i} for i in range(events)])
    broker = LocalKafka()
    relay = Relay(broker.host, broker.port)
    await relay.start()
    try:
        broker.advertised_port = relay.address[1]
        try:
            await asyncio.to_thread(broker.start)
        except KafkaSetupError as e:
            skip_or_fail(str(e))
        bootstrap = broker.bootstrap_servers
        topic = await asyncio.to_thread(create_topic, bootstrap, 4)
        proc = await asyncio.to_thread(start_worker, dsn, bootstrap, topic)
        try:
            await asyncio.to_thread(wait_for_records, bootstrap, topic, proc, 1500)
            relay.losing = True
            cut = time.monotonic()
            await wait_until(lambda: relay.lost_answers >= 3 and time.monotonic() - cut >= 5, 60, "a 5 s cut")
            relay.losing = False
            assert proc.poll() is None, "the worker finished during the cut: the test tested nothing"
            _, err = await asyncio.to_thread(proc.communicate, None, 240)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err[-3000:]
        by_pid: dict[str, list[int]] = {}
        for _, _, _, h in await asyncio.to_thread(read_topic, bootstrap, topic):
            by_pid.setdefault(h["pid"].decode(), []).append(int(h["seq_nr"]))
        assert by_pid == {f"acct|{p}": list(range(1, events + 1)) for p in range(pids)}
    finally:
        await asyncio.to_thread(broker.stop)
        await relay.close()


def start_cli_worker(name: str, dsn: str, bootstrap: str, topic: str, log: Path) -> subprocess.Popen[bytes]:
    """``projections run NAME --to-kafka TOPIC``, its stderr in ``log``."""
    from projection_helpers import FAST_ENV

    with open(log, "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "projections", "run", name, "--entity-type", "acct", "--to-kafka", topic,
             "--kafka-bootstrap", bootstrap, "--dsn", dsn, "--no-progress"],
            env={**os.environ, **FAST_ENV}, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip


async def test_brokers_down_when_the_worker_starts(
    journal: Journal, dsn: str, own_broker: object, tmp_path: Path
) -> None:
    """`projections run --to-kafka` started while the broker is down: one warning, then the worker
    waits with backoff (more failures than handler_attempts, none counted), its row says `Kafka
    unavailable since ...` in `projections status`; once the broker is started every event arrives
    exactly once and the row says the outage is over."""
    import signal

    import asyncpg

    from projections.kafka.local import LocalKafka
    from projections.postgres_store import ProjectionSql

    assert isinstance(own_broker, LocalKafka)
    pids, events = 30, 20
    for p in range(pids):
        await journal.persist(f"acct|{p}", [{"n": i} for i in range(events)])
    bootstrap = own_broker.bootstrap_servers
    topic = await asyncio.to_thread(create_topic, bootstrap, 4)
    await asyncio.to_thread(own_broker.halt)
    name = f"kp-{topic}"
    log_path = tmp_path / "worker.log"
    proc = await asyncio.to_thread(start_cli_worker, name, dsn, bootstrap, topic, log_path)
    conn = await asyncpg.connect(dsn)
    try:

        async def note(pattern: str) -> re.Match[str] | None:
            if proc.poll() is not None:
                raise AssertionError((await asyncio.to_thread(log_path.read_text))[-3000:])
            rows = await ProjectionSql("public").leases.workers(conn, name)
            return next((m for r in rows if (m := re.match(pattern, r["error"] or ""))), None)

        down = await wait_until(lambda: note(r"Kafka unavailable since \S+ \((\d+) failures\)"), 60, "the outage shown")
        assert "does not answer" in down.string, down.string
        await wait_until(lambda: note(r"Kafka unavailable since \S+ \(([6-9]|\d\d+) failures\)"), 90, "6 failures")
        status = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "projections", "status", name, "--dsn", dsn],
            capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"}, timeout=60,
        )  # fmt: skip
        assert status.returncode == 0 and "Kafka unavailable since" in status.stdout, status.stdout
        await asyncio.to_thread(own_broker.resume)

        async def all_published() -> bool:
            return len(await asyncio.to_thread(read_topic, bootstrap, topic)) >= pids * events

        await wait_until(all_published, 120, "every event published", every=0.2)
        await wait_until(lambda: note(r"Kafka was unavailable from "), 60, "the outage over in the worker's row")
    finally:
        await conn.close()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
    log = await asyncio.to_thread(log_path.read_text)
    assert code == 0, log[-3000:]
    by_pid: dict[str, list[int]] = {}
    for _, _, _, h in await asyncio.to_thread(read_topic, bootstrap, topic):
        by_pid.setdefault(h["pid"].decode(), []).append(int(h["seq_nr"]))
    assert by_pid == {f"acct|{p}": list(range(1, events + 1)) for p in range(pids)}
    assert f"Kafka at {bootstrap} does not answer" in log and "Traceback" not in log, log[-3000:]
    assert "batch failed" not in log and "HandlerFailed" not in log, log[-3000:]
    assert 1 <= log.count("Kafka unavailable (") <= 2, log[-3000:]  # once per outage, not per try


async def test_a_broker_down_mid_run_is_an_outage_not_a_failure(
    journal: Journal, dsn: str, own_broker: object, tmp_path: Path
) -> None:
    """The broker SIGKILLed while a worker publishes and kept down for longer than the publisher's
    time for a Kafka call (2 s here): the commit that timed out and every try after it are an
    outage, not the handler's failures. With one attempt allowed (retry-and-fail:1) the worker
    rides it out, its row says `Kafka unavailable since ...` past several failures, and once the
    broker is back every event is in the topic once, in order."""
    import asyncpg

    from projections.kafka.local import LocalKafka
    from projections.postgres_store import ProjectionSql

    assert isinstance(own_broker, LocalKafka)
    pids, events = 100, 60
    for p in range(pids):
        await journal.persist(f"acct|{p}", [{"n": i} for i in range(events)])
    bootstrap = own_broker.bootstrap_servers
    topic = await asyncio.to_thread(create_topic, bootstrap, 4)
    log_path = tmp_path / "worker.log"
    env = {"SJ_KAFKA_TIMEOUT": "2", "SJ_KAFKA_ON_FAILURE": "retry-and-fail:1"}
    proc = await asyncio.to_thread(start_logged_worker, [dsn, bootstrap, topic, "exactly-once", "none"], log_path, env)
    conn = await asyncpg.connect(dsn)
    try:
        await asyncio.to_thread(wait_for_records, bootstrap, topic, proc, 1500)
        await asyncio.to_thread(own_broker.halt, kill=True)

        async def three_failures_shown() -> bool:
            if proc.poll() is not None:
                raise AssertionError((await asyncio.to_thread(log_path.read_text))[-3000:])
            rows = await ProjectionSql("public").leases.workers(conn, f"pub-{topic}")
            found = [re.match(r"Kafka unavailable since \S+ \((\d+) failures\)", r["error"] or "") for r in rows]
            return any(int(m.group(1)) >= 3 for m in found if m)

        await wait_until(three_failures_shown, 60, "3 failures shown in the worker's row")
        await asyncio.to_thread(own_broker.resume)
        code = await asyncio.to_thread(proc.wait, 180)
    finally:
        await conn.close()
        if proc.poll() is None:
            proc.kill()
    log = await asyncio.to_thread(log_path.read_text)
    assert code == 0, log[-3000:]
    by_pid: dict[str, list[int]] = {}
    for _, _, _, h in await asyncio.to_thread(read_topic, bootstrap, topic):
        by_pid.setdefault(h["pid"].decode(), []).append(int(h["seq_nr"]))
    assert by_pid == {f"acct|{p}": list(range(1, events + 1)) for p in range(pids)}
    assert "batch failed" not in log and "HandlerFailed" not in log, log[-3000:]
    assert "Kafka unavailable (" in log, log[-3000:]


def start_logged_worker(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``python -m tests.kafka_worker ARGS`` with ``env`` added, its stderr in ``log``."""
    with open(log, "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.kafka_worker", *args],
            env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
