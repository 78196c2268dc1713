"""Kafka for the tests (a pytest plugin loaded by conftest.py): a real broker, never a mock.

The broker at ``KAFKA_BOOTSTRAP_SERVERS`` when set (``docker compose up -d kafka``), else ONE local
KRaft broker started for the session (:class:`projections.kafka.local.LocalKafka`: kafka_2.13
resolved from Maven Central into the user's cache, free loopback ports, a throwaway data
directory; ~4 s to start). Without Java, Maven or the confluent-kafka package the Kafka tests are
skipped with the reason, except in CI (``CI`` set), where they fail.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Mapping
from typing import NoReturn, Protocol, TypeVar

import pytest

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")


def skip_or_fail(reason: str) -> NoReturn:
    """Skip with the reason on a developer's machine; fail in CI, where nothing may be skipped."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the Kafka tests: {reason}", pytrace=False)
    pytest.skip(reason)


class Startable(Protocol):
    """A local broker or cluster (:mod:`projections.kafka.local`)."""

    def start(self) -> object: ...

    def stop(self) -> None: ...


N = TypeVar("N", bound=Startable)


@contextlib.contextmanager
def running(nodes: N) -> Iterator[N]:
    """``nodes`` started, stopped at the end; skipped (failed in CI) when Kafka cannot be set up here."""
    from journal.errors import KafkaSetupError

    try:
        nodes.start()
    except KafkaSetupError as e:
        nodes.stop()
        skip_or_fail(str(e))
    try:
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of the session's Kafka broker: ``KAFKA_BOOTSTRAP_SERVERS`` or one local broker."""
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        skip_or_fail("the confluent-kafka package is missing: pip install -e '.[kafka]'")
    if BOOTSTRAP:
        yield BOOTSTRAP
        return
    from projections.kafka.local import LocalKafka

    with running(LocalKafka()) as broker:
        yield broker.bootstrap_servers


def create_topic(
    bootstrap: str,
    partitions: int = 4,
    name: str | None = None,
    replicas: int = 1,
    *,
    client: Mapping[str, str] | None = None,
    **config: str,
) -> str:
    """A fresh topic (``sj-<random>`` unless named) with ``partitions`` partitions of ``replicas``
    replicas each, its ``config``; returns its name. ``client``: settings of the admin client (a login)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = name or f"sj-{uuid.uuid4().hex[:12]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **(client or {})})
    for future in admin.create_topics([NewTopic(topic, partitions, replicas, config=config)]).values():
        future.result(30)
    _wait_for_leaders(bootstrap, topic, partitions, client=client)
    return topic


def _wait_for_leaders(
    bootstrap: str, topic: str, partitions: int, timeout: float = 30.0, client: Mapping[str, str] | None = None
) -> None:
    """Until every partition of a new topic has a leader that answers (a new topic's metadata
    may say 'not leader' for a moment after the creation returns)."""
    import time

    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}", **(client or {})})
    deadline = time.monotonic() + timeout
    try:
        for p in range(partitions):
            while True:
                try:
                    consumer.get_watermark_offsets(TopicPartition(topic, p), 5)
                    break
                except KafkaException:
                    assert time.monotonic() < deadline, f"{topic} partition {p} has no leader after {timeout} s"
                    time.sleep(0.05)  # a retry interval: the loop waits on the leader's answer
    finally:
        consumer.close()


@pytest.fixture
def kafka_topic(kafka_bootstrap: str) -> str:
    """A fresh topic with 4 partitions on the session's broker."""
    return create_topic(kafka_bootstrap)


def read_topic(
    bootstrap: str, topic: str, timeout: float = 60.0, committed: bool = True, client: Mapping[str, str] | None = None
) -> list[tuple[int, bytes | None, bytes | None, dict[str, bytes]]]:
    """Every committed record of ``topic`` as ``(partition, key, value, headers)``, each partition
    in offset order, read with ``isolation.level=read_committed`` from the beginning up to each
    partition's high watermark when reading starts: it waits for the transactions open then to
    end (an AssertionError after ``timeout`` seconds if one does not)
    ``committed=False``: read_uncommitted, the records of aborted transactions too. ``client``:
    settings of the consumer (a login)."""
    import time

    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
        "isolation.level": "read_committed" if committed else "read_uncommitted",
        "enable.auto.commit": False, "enable.partition.eof": True, **(client or {}),
    })  # fmt: skip
    try:
        partitions = sorted(consumer.list_topics(topic, 30).topics[topic].partitions)
        ends = high_watermarks(bootstrap, topic, partitions, client)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records: list[tuple[int, bytes | None, bytes | None, dict[str, bytes]]] = []
        pending = {p for p in partitions if ends[p] > 0}
        deadline = time.monotonic() + timeout
        while pending:
            assert time.monotonic() < deadline, f"{topic}: partitions {sorted(pending)} not read to their end"
            for m in consumer.consume(10_000, 0.5):
                p = m.partition()
                if m.error() is None:
                    headers = {k: v for k, v in (m.headers() or []) if v is not None}
                    records.append((p, m.key(), m.value(), headers))
                if p in pending and consumer.position([TopicPartition(topic, p)])[0].offset >= ends[p]:
                    pending.discard(p)
        return records
    finally:
        consumer.close()


def high_watermarks(
    bootstrap: str, topic: str, partitions: list[int], client: Mapping[str, str] | None = None
) -> dict[int, int]:
    """Each partition's high watermark (a read_committed consumer's watermark is the last stable
    offset instead, which stays behind an open transaction)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
        "isolation.level": "read_uncommitted", **(client or {}),
    })  # fmt: skip
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 30)[1] for p in partitions}
    finally:
        consumer.close()
