"""Events out to Kafka on a real broker: each event exactly once and each persistence id's events
in seq_nr order after a worker process is SIGKILLed between the Kafka commit and the offsets'
commit, and restarted; the same test finds duplicates when the offsets are not in the Kafka
transaction (at-least-once mode)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter

import pytest
from kafka_fixtures import create_topic, read_topic

from journal import EventEnvelope, Journal, JournalSettings

pytestmark = pytest.mark.kafka

PIDS, EVENTS = 40, 25
ROUNDS = 5


def run_worker(dsn: str, bootstrap: str, topic: str, mode: str, crash: str) -> int:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.kafka_worker", dsn, bootstrap, topic, mode, crash],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode in (0, -9), proc.stderr[-3000:]
    return proc.returncode


@pytest.mark.parametrize(
    ("mode", "crash"),
    [("exactly-once", "after:1"), ("at-least-once", "after:1"), ("exactly-once", "inside:60")],
)
async def test_sigkill_then_restart(journal: Journal, dsn: str, kafka_bootstrap: str, mode: str, crash: str) -> None:
    """``after``: SIGKILL between the Kafka commit and the offsets' commit; ``inside``: in the
    middle of a Kafka transaction."""
    for i in range(EVENTS):
        for p in range(PIDS):
            await journal.persist(f"acct|{p}", [{"n": i, "pid": p}])
    topic = create_topic(kafka_bootstrap, partitions=4)

    assert run_worker(dsn, kafka_bootstrap, topic, mode, crash) == -9
    assert run_worker(dsn, kafka_bootstrap, topic, mode, "none") == 0

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


def high_watermark(bootstrap: str, topic: str) -> int:
    """Records written to ``topic`` so far (committed, aborted or open, with transaction markers)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in range(4))
    finally:
        consumer.close()


def kill_at(dsn: str, bootstrap: str, topic: str, marks: list[int]) -> None:
    """A worker per mark, each SIGKILLed once the topic holds ``mark`` records (wherever it is:
    reading, in a Kafka transaction, committing offsets), then one run to the end."""
    import time

    for mark in marks:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.kafka_worker", dsn, bootstrap, topic, "exactly-once", "none"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while high_watermark(bootstrap, topic) < mark:
            assert proc.poll() is None and time.monotonic() < deadline, f"the worker ended before {mark} records"
        proc.kill()
        proc.wait()
    assert run_worker(dsn, bootstrap, topic, "exactly-once", "none") == 0


async def test_sigkill_at_three_moments_of_a_run(journal: Journal, dsn: str, kafka_bootstrap: str) -> None:
    import asyncio

    pids, events = 100, 60
    for p in range(pids):
        await journal.persist(f"acct|{p}", [{"n": i} for i in range(events)])
    topic = create_topic(kafka_bootstrap, partitions=4)
    await asyncio.to_thread(kill_at, dsn, kafka_bootstrap, topic, [800, 2500, 4500])

    records = read_topic(kafka_bootstrap, topic)
    by_pid: dict[str, list[int]] = {}
    for _, _, _, h in records:
        by_pid.setdefault(h["pid"].decode(), []).append(int(h["seq_nr"]))
    assert by_pid == {f"acct|{p}": list(range(1, events + 1)) for p in range(pids)}


async def test_a_zombie_of_a_range_is_fenced(journal: Journal, kafka_bootstrap: str) -> None:
    """Two publishers of the same projection and range (a stalled worker that comes back after a
    newer one took its range): the older cannot commit, its batch is not in the topic, and it
    stops processing the range (LeaseLost, not a failure of the batch)."""
    from journal.errors import LeaseLost
    from projections import range_context
    from projections.kafka.publisher import KafkaPublisher

    topic = create_topic(kafka_bootstrap)
    projection = f"zombie-{topic}"
    first = await journal.persist("acct|z", [{"n": 1}])
    second = await journal.persist("acct|z", [{"n": 2}])
    old, new = KafkaPublisher(kafka_bootstrap, topic), KafkaPublisher(kafka_bootstrap, topic)
    old_range = range_context.OwnedRange(projection, 0, 1023)
    new_range = range_context.OwnedRange(projection, 0, 1023)  # a newer owner of the same slices
    range_context.enter(old_range)
    await old(None, first)  # the old owner publishes seq 1
    range_context.enter(new_range)
    await new(None, [])  # opens its producer: init_transactions fences the old one
    range_context.enter(old_range)
    with pytest.raises(LeaseLost, match="fenced by another worker's"):
        await old(None, second)
    range_context.enter(new_range)
    await new(None, first + second)  # seq 1 is known published: only seq 2 goes out
    await new.close()
    range_context.enter(range_context.OwnedRange(f"other-{topic}", 0, 1023))
    await old(None, [])  # the next range it opens: its fenced producer is closed then
    await old.close()
    records = read_topic(kafka_bootstrap, topic)
    assert [int(h["seq_nr"]) for *_, h in records] == [1, 2]


async def test_a_new_owner_fences_the_old_one_before_its_first_batch(
    journal: Journal, settings: JournalSettings, kafka_bootstrap: str
) -> None:
    """A worker's publisher opens a range's producer when the range starts, not at its first
    batch: a stalled earlier owner of the range, its transaction open, is fenced and that
    transaction aborted though the journal has nothing for the range to publish. Before, it
    stayed open until an event came or the broker's ``transaction.timeout.ms`` (60 s) ran out,
    holding back every read_committed consumer of the topic."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    from projections import Worker
    from projections.kafka.offsets_log import transactional_id
    from projections.kafka.publisher import KafkaPublisher
    from tests.support.waiting import wait_until

    topic = create_topic(kafka_bootstrap, partitions=1)
    projection = f"early-{topic}"
    zombie = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": transactional_id(projection, 0, 1023)})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(topic, b"stale", b"acct|z")
    assert zombie.flush(30) == 0
    reader = Consumer(
        {"bootstrap.servers": kafka_bootstrap, "group.id": projection, "isolation.level": "read_committed"}
    )

    def stable_offset() -> int:  # a read_committed consumer's end: behind the open transaction
        return int(reader.get_watermark_offsets(TopicPartition(topic, 0), 10)[1])

    assert stable_offset() == 0
    publisher = KafkaPublisher(kafka_bootstrap, topic)
    worker = Worker(journal, settings, projection, "NothingToPublish", publisher, "grouped")
    task = asyncio.create_task(worker.run())
    try:
        await wait_until(lambda: asyncio.to_thread(stable_offset), 20, "the open transaction to be aborted")
        assert list(worker.processors) == [(0, 1023)] and worker.stats.events == 0
    finally:
        worker.stop()
        await task
        await publisher.close()
        reader.close()
    with pytest.raises(KafkaException, match=r"(?i)fenced"):
        zombie.commit_transaction(10)
    assert read_topic(kafka_bootstrap, topic) == []


async def test_a_producer_fenced_by_one_of_its_own_process_redoes_the_batch(
    journal: Journal, kafka_bootstrap: str
) -> None:
    """A publisher's producer of a range fenced by another producer of the same publisher (one it
    abandoned in an outage, whose initialization went on in the background): an outage, the
    batch redone through a new producer, not a failure."""
    from journal.errors import DestinationUnavailable
    from projections import range_context
    from projections.kafka.offsets_log import transactional_id
    from projections.kafka.publisher import KafkaPublisher

    topic = create_topic(kafka_bootstrap)
    projection = f"own-{topic}"
    first = await journal.persist("acct|o", [{"n": 1}])
    second = await journal.persist("acct|o", [{"n": 2}])
    publisher = KafkaPublisher(kafka_bootstrap, topic)
    range_context.enter(range_context.OwnedRange(projection, 0, 1023))
    await publisher(None, first)
    txn = transactional_id(projection, 0, 1023)
    abandoned = publisher.instances.producer(txn)  # its initialization ends after the range's producer's
    publisher.instances.init(abandoned, txn, 30)
    with pytest.raises(DestinationUnavailable, match="fenced by a newer one of this process"):
        await publisher(None, second)
    await publisher(None, first + second)  # the retry: a new producer, seq 1 known published
    await publisher.close()
    records = read_topic(kafka_bootstrap, topic)
    assert [int(h["seq_nr"]) for *_, h in records] == [1, 2]


async def test_a_killed_owner_of_other_slices_does_not_hold_the_topic(
    journal: Journal, dsn: str, kafka_bootstrap: str
) -> None:
    """A worker (slices 0-1023) is SIGKILLed before its first Kafka commit, the transaction's
    records written; the next owner of a part of its slices has another range, so another
    transactional id (a worker that starts while the killed one's leases have not expired yet).
    Its batch is visible to a read_committed consumer at once, not only once the transaction
    coordinator aborts the killed transaction (transaction.timeout.ms, 60 s)."""
    import time

    from projections import range_context
    from projections.kafka.publisher import KafkaPublisher

    envelopes = [e for p in range(PIDS) for e in await journal.persist(f"acct|{p}", [{"n": i} for i in range(5)])]
    topic = create_topic(kafka_bootstrap, partitions=4)
    assert run_worker(dsn, kafka_bootstrap, topic, "exactly-once", "flushed:1") == -9
    assert len(read_topic(kafka_bootstrap, topic, committed=False)) > 0, "the killed transaction wrote nothing"

    ours = [e for e in envelopes if e.slice <= 511]
    range_context.enter(range_context.OwnedRange(f"pub-{topic}", 0, 511))
    publisher = KafkaPublisher(kafka_bootstrap, topic)
    began = time.monotonic()
    await publisher(None, ours)
    await publisher.close()
    records = read_topic(kafka_bootstrap, topic, timeout=20)
    print(f"published and read in {time.monotonic() - began:.1f} s")
    assert sorted((h["pid"].decode(), int(h["seq_nr"])) for *_, h in records) == sorted(
        (e.persistence_id, e.seq_nr) for e in ours
    )


async def test_a_transaction_that_does_not_end_is_said_not_read_past(journal: Journal, kafka_bootstrap: str) -> None:
    """A transaction of another producer is left open on the offsets topic (a hanging one): a
    range's producer does not take the offsets before it for all there is; it says so, an outage."""
    from confluent_kafka import Producer

    from journal.errors import DestinationUnavailable
    from projections import range_context
    from projections.kafka.publisher import KafkaPublisher

    topic = create_topic(kafka_bootstrap)
    offsets = create_topic(kafka_bootstrap, partitions=1)
    stranger = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"stranger-{topic}"})
    stranger.init_transactions(30)
    stranger.begin_transaction()
    stranger.produce(offsets, b'{"pid": "acct|h", "slice": 1, "seq_nr": 1}', b"acct|h")
    stranger.flush(30)
    publisher = KafkaPublisher(kafka_bootstrap, topic, offsets_topic=offsets, timeout=2)
    try:
        range_context.enter(range_context.OwnedRange(f"hang-{topic}", 0, 1023))
        events = await journal.persist("acct|h", [{"n": 1}])
        with pytest.raises(DestinationUnavailable, match=f"a transaction open on {offsets} partition 0 since offset 0"):
            await publisher(None, events)
    finally:
        stranger.abort_transaction(30)
        stranger.close()
        await publisher.close()


async def test_a_failed_delivery_fails_its_own_ranges_batch(journal: Journal, kafka_bootstrap: str) -> None:
    """At least once, two ranges of one publisher flush at the same time; the broker refuses a
    record of one (over the topic's size limit): that range's batch fails, the other's goes out
    (a failed delivery is its range's, never taken by another range's flush)."""
    from journal.errors import KafkaPublishError
    from journal.ids import slice_for
    from projections import range_context
    from projections.kafka.publisher import KafkaPublisher

    topic = create_topic(kafka_bootstrap, **{"max.message.bytes": "20000"})
    low, high = (
        next(f"acct|{i}" for i in range(1000) if (slice_for(f"acct|{i}") < 512) == lower) for lower in (True, False)
    )
    big = await journal.persist(low, [{"pad": "x" * 50000}])
    small = await journal.persist(high, [{"n": i} for i in range(50)])
    publisher = KafkaPublisher(kafka_bootstrap, topic, exactly_once=False)

    async def publish(lo: int, hi: int, envelopes: list[EventEnvelope]) -> None:
        owned = range_context.OwnedRange(f"own-failures-{topic}", lo, hi)  # new ranges, new producers:
        range_context.enter(owned)  # both flushes wait for their producer id, so they end together
        await publisher(None, envelopes)

    for _ in range(ROUNDS):
        high_batch, low_batch = await asyncio.gather(
            publish(512, 1023, small), publish(0, 511, big), return_exceptions=True
        )
        assert isinstance(low_batch, KafkaPublishError) and "too large" in str(low_batch).lower(), low_batch
        assert high_batch is None, high_batch
    await publisher.close()
    assert sorted(int(h["seq_nr"]) for *_, h in read_topic(kafka_bootstrap, topic)) == sorted(
        list(range(1, 51)) * ROUNDS
    )


def test_a_fenced_producer_with_an_open_transaction_closes_without_raising(kafka_bootstrap: str) -> None:
    """A dropped range's producer is closed when the next range opens. One fenced while its
    transaction was open (its records delivered) raises its fatal error from ``close``, which
    then failed the next range's batch (CI, test_kafka_faults' broker down mid run: "batch
    failed 1 times, last error: KafkaException: ... fenced by a newer instance")."""
    from confluent_kafka import Producer

    from projections.kafka.publisher import close_producers

    topic = create_topic(kafka_bootstrap)
    config = {"bootstrap.servers": kafka_bootstrap, "transactional.id": f"fenced-{topic}"}
    old = Producer(config)
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(topic, b"v", b"k")
    assert old.flush(30) == 0
    newer = Producer(config)
    newer.init_transactions(30)  # fences the old one, whose transaction is open
    try:
        close_producers([old])  # raised KafkaException(_FENCED, "Failed to end transaction")
    finally:
        newer.close()
    assert read_topic(kafka_bootstrap, topic) == []  # its transaction was never committed


def test_every_client_of_the_publisher_connects_to_every_broker_unless_configured() -> None:
    """Sparse connections (librdkafka's default) made each new client of the publisher wait ~50 ms
    for its second connection (docs/kafka-speed-history.md, "Every new client waited 50 ms"): its
    producers, the offsets topic's consumers and the topic check's admin client are all made from
    ``client_config`` (the producers' adds :data:`PRODUCER_DEFAULTS`), with sparse connections off
    unless the publisher's ``config`` sets them."""
    from projections.kafka.publisher import KafkaPublisher

    publisher = KafkaPublisher("127.0.0.1:9", "t")
    assert publisher.client_config["enable.sparse.connections"] is False
    assert publisher.producer_config["enable.sparse.connections"] is False
    assert publisher.instances.config["enable.sparse.connections"] is False
    chosen = KafkaPublisher("127.0.0.1:9", "t", config={"enable.sparse.connections": True})
    assert chosen.client_config["enable.sparse.connections"] is True
    assert chosen.producer_config["enable.sparse.connections"] is True


def test_the_offsets_log_asks_and_reads_through_one_consumer_per_isolation_level(kafka_bootstrap: str) -> None:
    """A range's open asks the offsets topic's ends, reads the rows past its last stable offset,
    fences the earlier owner named there, then asks the ends again and reads the topic back: all
    through two consumers (was: a new consumer, each its connections to every broker, for each of
    the five), closed with the log."""
    from confluent_kafka import Producer

    from projections.kafka.instances import Instances
    from projections.kafka.offsets_log import OffsetsLog
    from projections.kafka.publisher import close_producers

    offsets = create_topic(kafka_bootstrap, partitions=1)
    name = f"p{offsets[-8:]}"

    def producer(lo: int, hi: int) -> Producer:
        p = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"sj.{name}.{lo}-{hi}"})
        p.init_transactions(30)
        p.begin_transaction()
        return p

    done = producer(0, 1023)
    done.produce(
        offsets, b'{"pid": "acct|a", "slice": 5, "seq_nr": 3, "txn": "sj.%s.0-1023"}' % name.encode(), b"acct|a"
    )
    done.commit_transaction(30)
    earlier = producer(0, 511)  # killed while its transaction was open
    earlier.produce(
        offsets, b'{"pid": "acct|a", "slice": 5, "seq_nr": 9, "txn": "sj.%s.0-511"}' % name.encode(), b"acct|a"
    )
    assert earlier.flush(30) == 0
    log = OffsetsLog({"bootstrap.servers": kafka_bootstrap}, offsets, name, 0, 255, 10, Instances({
        "bootstrap.servers": kafka_bootstrap}))  # fmt: skip
    try:
        assert log.end_open_transactions() == [f"sj.{name}.0-511"]
        assert log.published() == {"acct|a": 3}
        assert log.consumers == 2
    finally:
        log.close()
        close_producers([done, earlier])
    assert log.consumers == 0
