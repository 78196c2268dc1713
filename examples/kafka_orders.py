"""Example: a service's order events arrive in a Kafka topic, each exactly once (docs/kafka.md).

Run: ``KAFKA_BOOTSTRAP_SERVERS=localhost:9092 JOURNAL_DSN=postgresql://... python examples/kafka_orders.py``
(``docker compose up -d kafka`` for a broker; no JOURNAL_DSN: the embedded PostgreSQL). It creates
a topic, writes three orders' events, publishes them with a projection worker and prints what a
``read_committed`` consumer of the topic receives.
"""

from __future__ import annotations

import asyncio
import os
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from journal import open_journal
from projections import Worker
from projections.kafka.publisher import KafkaPublisher
from projections.management import processed_up_to


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the futures resolve
    for future in admin.create_topics([NewTopic(topic, 3, 1)]).values():
        future.result(30)


def consume(bootstrap: str, topic: str, count: int) -> list[str]:
    """The first ``count`` committed records, as 'key seq_nr value' lines."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"example-{uuid.uuid4().hex}",
        "isolation.level": "read_committed",  # what every consumer of an exactly-once topic must set
    })  # fmt: skip
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)])
    lines: list[str] = []
    try:
        for _ in range(120):
            for m in consumer.consume(count, 0.5):
                if m.error() is None:
                    headers = dict(m.headers() or [])
                    lines.append(f"{m.key()!r} #{headers['seq_nr']!r} {m.value()!r}")
            if len(lines) >= count:
                break
    finally:
        consumer.close()
    return lines


async def main() -> list[str]:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic)
    publisher = KafkaPublisher(bootstrap, topic)
    async with open_journal() as j:
        for order in ("o1", "o2", "o3"):
            await j.persist(f"order|{order}", [{"placed": order}, {"paid": order}])
        worker = Worker(j, j.settings, f"to-{topic}", "order", publisher, "grouped")
        task = asyncio.create_task(worker.run())
        targets = {f"order|{o}": 2 for o in ("o1", "o2", "o3")}
        async with asyncio.timeout(60):  # the stored offsets say when everything is published
            while not await processed_up_to(j, f"to-{topic}", targets):  # noqa: ASYNC110 (a poll of the database)
                await asyncio.sleep(0.1)
        worker.stop()
        await task
    await publisher.close()
    return await asyncio.to_thread(consume, bootstrap, topic, 6)


if __name__ == "__main__":
    for line in asyncio.run(main()):
        print(line)
