"""Kafka refusing the projection itself, on a real broker with SASL/PLAIN logins and ACLs: a wrong
password, a topic the user may not write, a transactional id the user may not use. Each is one
line naming the cause with exit code 2, at once (no retry loop), never a dead letter; with the
missing ACL granted the same command publishes every event once."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka_fixtures import create_topic, read_topic, running
from projection_helpers import FAST_ENV

from journal import Journal

pytestmark = pytest.mark.kafka

USERS = {"admin": "admin-secret", "alice": "alice-secret-7q"}


@pytest.fixture
def sasl_broker() -> Iterator[Any]:
    """A broker of this test alone: SASL/PLAIN logins of USERS, an authorizer, admin a super user."""
    pytest.importorskip("confluent_kafka")
    from projections.kafka.local import LocalKafka

    with running(LocalKafka(users=USERS)) as broker:
        yield broker


def allow(admin_config: dict[str, str], *grants: tuple[str, str, str, str]) -> None:
    """ACLs allowing alice ``(resource type, name, pattern, operation)``, e.g. a topic's WRITE."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    bindings = [
        AclBinding(
            ResourceType[kind], name, ResourcePatternType[pattern], "User:alice", "*",
            AclOperation[op], AclPermissionType.ALLOW,
        )
        for kind, name, pattern, op in grants
    ]  # fmt: skip
    admin = AdminClient(admin_config)  # kept until the futures are done (destroyed, it fails them)
    for future in admin.create_acls(bindings).values():
        future.result(30)


def run_publisher(dsn: str, broker: Any, topic: str, settings: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``projections run kp-<topic> --to-kafka TOPIC --kafka-config SETTINGS`` until it ends by
    itself (a refusal), or for at most 60 s."""
    return subprocess.run(
        [sys.executable, "-m", "projections", "run", f"kp-{topic}", "--entity-type", "acct", "--to-kafka", topic,
         "--kafka-bootstrap", broker.bootstrap_servers, "--kafka-config", str(settings), "--dsn", dsn,
         "--no-progress", *extra],
        env={**os.environ, **FAST_ENV}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def login_file(path: Path, password: str) -> Path:
    path.write_text(
        "# alice's login\nsecurity.protocol=SASL_PLAINTEXT\nsasl.mechanisms=PLAIN\n"
        f"sasl.username=alice\nsasl.password={password}\n",
        "utf-8",
    )
    return path


async def test_refusals_are_one_line_and_stop_at_once(
    journal: Journal, dsn: str, sasl_broker: Any, tmp_path: Path
) -> None:
    import asyncio

    from test_kafka_cli import projections

    for p in range(10):
        await journal.persist(f"acct|{p}", [{"n": i} for i in range(5)])
    admin = sasl_broker.client_config()
    topic = "orders"
    await asyncio.to_thread(create_topic, sasl_broker.bootstrap_servers, 1, topic, client=admin)
    right, wrong = login_file(tmp_path / "alice", USERS["alice"]), login_file(tmp_path / "wrong", "not-her-password")

    out = await asyncio.to_thread(run_publisher, dsn, sasl_broker, topic, wrong)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(f"error: Kafka at {sasl_broker.bootstrap_servers} refused the login: "), out.stderr
    assert len(out.stderr.splitlines()) == 1 and "not-her-password" not in out.stderr, out.stderr

    out = await asyncio.to_thread(run_publisher, dsn, sasl_broker, topic, right)  # no ACL yet
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert "Topic authorization failed" in out.stderr, out.stderr

    offsets = f"sj-offsets.kp-{topic}"
    grants = [("TOPIC", topic, "LITERAL", op) for op in ("DESCRIBE", "WRITE")]
    grants += [("TOPIC", offsets, "LITERAL", "ALL"), ("GROUP", "sj-offsets-loader.", "PREFIXED", "READ")]
    await asyncio.to_thread(allow, admin, *grants)
    out = await asyncio.to_thread(
        run_publisher, dsn, sasl_broker, topic, right, "--on-failure", "retry-and-dead-letter:3"
    )  # the transactional id is not allowed: the first batch's init_transactions is refused
    assert out.returncode == 2, out.stderr
    last = out.stderr.splitlines()[-1]
    assert last.startswith("error: ") and "Transactional Id authorization failed" in last, out.stderr
    assert "Traceback" not in out.stderr and "batch failed" not in out.stderr, out.stderr
    letters = projections("dead-letters", "list", f"kp-{topic}", "--dsn", dsn)
    assert letters.stdout.strip().endswith(f"0 dead letters of kp-{topic}"), letters.stdout + letters.stderr

    transactional_ids = [("TRANSACTIONAL_ID", f"sj.kp-{topic}.", "PREFIXED", op) for op in ("DESCRIBE", "WRITE")]
    await asyncio.to_thread(allow, admin, *transactional_ids)
    records = await asyncio.to_thread(publish_all, dsn, sasl_broker, topic, right, admin, 50)
    assert sorted((h["pid"], int(h["seq_nr"])) for *_, h in records) == sorted(
        (f"acct|{p}".encode(), s) for p in range(10) for s in range(1, 6)
    )


def publish_all(dsn: str, broker: Any, topic: str, settings: Path, admin: dict[str, str], n: int) -> list[Any]:
    """Run the publisher until the topic holds ``n`` committed records (read as admin), SIGTERM it."""
    import signal
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "projections", "run", f"kp-{topic}", "--entity-type", "acct", "--to-kafka", topic,
         "--kafka-bootstrap", broker.bootstrap_servers, "--kafka-config", str(settings), "--dsn", dsn,
         "--no-progress"],
        env={**os.environ, **FAST_ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(read_topic(broker.bootstrap_servers, topic, client=admin)) < n:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr and proc.stderr.read()
    except BaseException:
        proc.kill()
        raise
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-3000:]
    return read_topic(broker.bootstrap_servers, topic, client=admin)
