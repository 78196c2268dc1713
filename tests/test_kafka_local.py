"""The local Kafka broker the tests run on: it starts from the Maven Central jars, it runs
transactions (a read_committed consumer sees committed records only), and without Java it fails
with one line saying what to install."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from kafka_fixtures import create_topic, read_topic, running

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


def test_the_broker_keeps_its_data_where_it_is_told(tmp_path: Path) -> None:
    """``storage``: the directory the broker's throwaway data directory is made in (the Kafka
    benchmark gives a RAM disk); it is removed on stop, the storage kept."""
    from projections.kafka.local import LocalKafka

    broker = LocalKafka(storage=tmp_path)
    assert broker.data_dir.parent == tmp_path and broker.data_dir.is_dir()
    broker.stop()
    assert not broker.data_dir.exists() and tmp_path.is_dir()


def test_three_nodes_commit_with_one_stopped() -> None:
    """LocalKafkaCluster(3): a topic and the transaction state log replicated 3 times,
    min.insync.replicas 2, so a transaction still commits with one node stopped."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient

    from projections.kafka.local import LocalKafkaCluster

    with running(LocalKafkaCluster(3)) as cluster:
        bootstrap = cluster.bootstrap_servers
        topic = create_topic(bootstrap, 2, None, 3)
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"t-{uuid.uuid4().hex}"})
        producer.init_transactions(60)
        for batch in ("before", "after"):
            if batch == "after":
                cluster.nodes[2].halt()
            producer.begin_transaction()
            for i in range(10):
                producer.produce(topic, f"{batch}-{i}".encode(), str(i).encode())
            producer.commit_transaction(60)
        meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics
        assert {len(p.replicas) for t in (topic, "__transaction_state") for p in meta[t].partitions.values()} == {3}
        values = sorted(value or b"" for _, _, value, _ in read_topic(bootstrap, topic))
        assert values == sorted(f"{b}-{i}".encode() for b in ("before", "after") for i in range(10))
