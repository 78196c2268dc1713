"""Events out to Kafka: the KafkaPublisher projection (exactly-once, then at-least-once) beside a
bare confluent-kafka producer sending the same records (same keys, values, headers; idempotent,
no transactions), in the same run. Usage:
    [JOURNAL_DSN=postgresql://...] [KAFKA_BOOTSTRAP_SERVERS=host:port] \\
        python benchmarks/kafka_publish.py [--events N] [--workers K]
(default 200,000 events; a fresh database on JOURNAL_DSN's server, else an embedded server; a
local KRaft broker started from the Maven Central jars unless KAFKA_BOOTSTRAP_SERVERS is set).
Prints events/s and each mode's ratio to the bare producer."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import Iterator

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from journal import EventEnvelope, JournalSettings, Write, failures, open_journal
from projections import Worker
from projections.kafka.local import LocalKafka
from projections.kafka.publisher import KafkaPublisher, headers_of

try:
    from benchmarks._common import fresh_database
except ImportError:  # run as a script from benchmarks/
    from _common import fresh_database  # type: ignore[no-redef]


@contextlib.contextmanager
def broker() -> Iterator[str]:
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield os.environ["KAFKA_BOOTSTRAP_SERVERS"]
        return
    with LocalKafka(heap="1G") as k:
        yield k.bootstrap_servers


def new_topic(bootstrap: str, partitions: int = 8) -> str:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the futures resolve
    for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        f.result(30)
    return topic


async def bare(bootstrap: str, envs: list[EventEnvelope], value: KafkaPublisher) -> float:
    """The same records through one idempotent producer, flushed at the end."""
    topic = new_topic(bootstrap)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    t0 = time.perf_counter()
    for e in envs:
        while True:
            try:
                p.produce(topic, value.value(e.event), e.persistence_id.encode(), headers=headers_of(e))
                break
            except BufferError:
                await asyncio.to_thread(p.poll, 0.1)
    await asyncio.to_thread(p.flush, 60)
    return len(envs) / (time.perf_counter() - t0)


async def publish(j: object, s: JournalSettings, et: str, bootstrap: str, n: int, workers: int, eo: bool) -> float:
    topic = new_topic(bootstrap)
    publisher = KafkaPublisher(bootstrap, topic, exactly_once=eo)
    ws = [Worker(j, s, f"bench-{topic}", et, publisher, "grouped") for _ in range(workers)]  # type: ignore[arg-type]
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(w.run()) for w in ws]
    while sum(w.stats.events for w in ws) < n:
        for task in tasks:
            if task.done():
                task.result()
        await asyncio.sleep(0.02)
    rate = n / (time.perf_counter() - t0)
    for w in ws:
        w.stop()
    await asyncio.gather(*tasks)
    await publisher.close()
    return rate


async def main(dsn: str, bootstrap: str, n: int, entities: int, group_size: int, workers: int) -> None:
    et = f"Bench{uuid.uuid4().hex[:6]}"
    s = JournalSettings.load(env={}, dsn=dsn, group_size=group_size, buffer_size=10_000)
    async with open_journal(dsn, settings=s) as j:
        per_call, done = 500, 0
        while done < n:
            parts = [
                Write(
                    f"{et}|e{(done // per_call + k) % entities}", [{"v": i, "pad": "x" * 40} for i in range(per_call)]
                )
                for k in range(min(20, max(1, (n - done) // per_call)))
            ]
            out = await asyncio.wait_for(j.persist_many(parts), 120)
            assert not failures(out), failures(out)[:3]
            done += len(parts) * per_call
        n = done
        envs = [e async for e in j.current_events_by_slices(et, 0, 1023)]
        assert len(envs) == n
        bare_rate = await bare(bootstrap, envs, KafkaPublisher(bootstrap, "unused"))
        eo_rate = await publish(j, s, et, bootstrap, n, workers, eo=True)
        alo_rate = await publish(j, s, et, bootstrap, n, workers, eo=False)
    print(f"load average: {os.getloadavg()}; {n} events, {workers} worker(s), group_size {group_size}")
    print(f"bare idempotent producer (ceiling): {bare_rate:12,.0f} events/s")
    print(f"exactly-once publisher:             {eo_rate:12,.0f} events/s  ({eo_rate / bare_rate:.2f} of bare)")
    print(f"at-least-once publisher:            {alo_rate:12,.0f} events/s  ({alo_rate / bare_rate:.2f} of bare)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--entities", type=int, default=10_000)
    ap.add_argument("--group-size", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=2, help="workers (slice ranges) in this process")
    a = ap.parse_args()
    with fresh_database() as dsn, broker() as bootstrap:
        asyncio.run(main(dsn, bootstrap, a.events, a.entities, a.group_size, a.workers))
