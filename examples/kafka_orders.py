"""Example: a service's order events arrive in a Kafka topic, each exactly once (docs/kafka.md).

Run: ``KAFKA_BOOTSTRAP_SERVERS=localhost:9092 JOURNAL_DSN=postgresql://... python examples/kafka_orders.py``
(``docker compose up -d kafka`` for a broker; no JOURNAL_DSN: the embedded PostgreSQL). It creates
the topic (``KAFKA_TOPIC``, default ``orders``) unless it exists, writes three new orders' events,
publishes them with the projection ``to-<topic>`` and prints what a ``read_committed`` consumer
receives from the topic's end as it was before. Run it again: the projection resumes from its
offsets, so only the new run's orders are published, each once.
"""

from __future__ import annotations

import asyncio
import os
import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from journal import open_journal
from projections import Worker
from projections.kafka.offsets_log import topic_ends
from projections.kafka.publisher import KafkaPublisher
from projections.management import processed_up_to


def ensure_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the futures resolve
    for future in admin.create_topics([NewTopic(topic, 3, 1)]).values():
        try:
            future.result(30)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # a run before this one made it
                raise


def new_consumer(bootstrap: str) -> Consumer:
    return Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"example-{uuid.uuid4().hex}",
        "isolation.level": "read_committed",  # what every consumer of an exactly-once topic must set
    })  # fmt: skip


def ends(bootstrap: str, topic: str) -> list[TopicPartition]:
    """Where each partition of ``topic`` ends now: this run's records come after."""
    consumer = new_consumer(bootstrap)
    try:
        # a topic made a moment ago may not have its leaders yet: topic_ends asks again
        return [TopicPartition(topic, p, end) for p, end in topic_ends(consumer, topic, 30).items()]
    finally:
        consumer.close()


def text(field: str | bytes | None) -> str:
    """A record's key, value or header as text (the publisher writes UTF-8 bytes)."""
    return field.decode() if isinstance(field, bytes) else field or ""


def consume(bootstrap: str, start: list[TopicPartition], count: int) -> list[str]:
    """The first ``count`` committed records from ``start``, as 'key #seq_nr value' lines."""
    consumer = new_consumer(bootstrap)
    consumer.assign(start)
    lines: list[str] = []
    try:
        for _ in range(120):
            for m in consumer.consume(count, 0.5):
                if m.error() is None:
                    seq_nr = dict(m.headers() or []).get("seq_nr")
                    lines.append(f"{text(m.key())} #{text(seq_nr)} {text(m.value())}")
            if len(lines) >= count:
                break
    finally:
        consumer.close()
    return lines


async def main() -> list[str]:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
    topic = os.environ.get("KAFKA_TOPIC", "orders")
    await asyncio.to_thread(ensure_topic, bootstrap, topic)
    start = await asyncio.to_thread(ends, bootstrap, topic)
    run = uuid.uuid4().hex[:6]  # this run's orders: new ones each time
    orders = [f"{run}-o{i}" for i in (1, 2, 3)]
    publisher = KafkaPublisher(bootstrap, topic)
    async with open_journal() as j:
        for order in orders:
            await j.persist(f"order|{order}", [{"placed": order}, {"paid": order}])
        worker = Worker(j, j.settings, f"to-{topic}", "order", publisher, "grouped")
        task = asyncio.create_task(worker.run())
        targets = {f"order|{o}": 2 for o in orders}
        async with asyncio.timeout(60):  # the stored offsets say when everything is published
            while not await processed_up_to(j, f"to-{topic}", targets):  # noqa: ASYNC110 (a poll of the database)
                await asyncio.sleep(0.1)
        worker.stop()
        await task
    await publisher.close()
    return await asyncio.to_thread(consume, bootstrap, start, 2 * len(orders))


if __name__ == "__main__":
    for line in asyncio.run(main()):
        print(line)
