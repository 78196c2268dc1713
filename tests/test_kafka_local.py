"""The local Kafka broker the tests run on: it starts from the Maven Central jars, it runs
transactions (a read_committed consumer sees committed records only), and without Java it fails
with one line saying what to install."""

from __future__ import annotations

import os
import uuid

import pytest
from kafka_fixtures import read_topic

pytestmark = pytest.mark.kafka


def test_the_local_broker_runs_transactions(kafka_bootstrap: str, kafka_topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"t-{uuid.uuid4().hex}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(kafka_topic, f"kept-{i}".encode(), b"k")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(kafka_topic, b"aborted", b"k")
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(kafka_topic, b"last", b"k")
    producer.commit_transaction(30)

    assert [value for _, _, value, _ in read_topic(kafka_bootstrap, kafka_topic)] == [
        *(f"kept-{i}".encode() for i in range(10)),
        b"last",
    ]


def test_without_java_the_broker_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    from journal.errors import KafkaSetupError
    from projections.kafka.local import LocalKafka

    monkeypatch.setenv("PATH", os.devnull)
    broker = LocalKafka(cache=None)
    try:
        with pytest.raises(KafkaSetupError, match=r"needs Java 17 \(java\) and Maven \(mvn\) on PATH"):
            broker._java(broker.data_dir)
    finally:
        broker.stop()
