"""A projection's offsets topic, read back when a range's producer opens (docs/kafka.md, "Exactly
once"), and the transactions that earlier owners of the range's slices left open, ended.

Each row of the offsets topic is ``{"pid", "slice", "seq_nr", "txn"}``: the highest sequence
number of a persistence id that a transaction published, and that transaction's transactional id.

A range's transactional id is made of its slices, and the ranges of a projection change: a
worker that starts while the lease of a killed one has not expired yet takes a part of the
slices first, then the rest. The next owner of a killed worker's slices may so have another
transactional id, and its ``init_transactions`` does not end the killed worker's transaction: it
stays open until the transaction coordinator aborts it (``transaction.timeout.ms``, 60 s by
default), and until then a ``read_committed`` consumer sees nothing past it, on every partition
it wrote to (their last stable offset stays behind it). So when a range opens,
:meth:`OffsetsLog.end_open_transactions` reads the rows past each partition's last stable offset
(``read_uncommitted``: the rows of the open transactions are among them); the transactional ids
they name of another range of the same projection sharing slices with this one are earlier owners
of these slices, and a producer of each such id calls ``init_transactions``, which aborts its open
transaction and fences it. Then :meth:`OffsetsLog.published` reads the topic (``read_committed``)
up to its high watermark, waiting for the transactions open then to end; behind one that does not
end it raises :class:`StuckTransaction` rather than return stale offsets. A log asks and reads
through one consumer per isolation level, made at its first use and kept until :meth:`OffsetsLog.close`
(each consumer connects to every broker: ``publisher.CLIENT_DEFAULTS``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from . import causes
from .instances import Instances

log = logging.getLogger("projections.kafka")

_NO_LEADER_YET = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
)
"""What a topic created a moment ago may answer before its partitions have leaders."""


def topic_ends(consumer: Consumer, topic: str, timeout: float) -> dict[int, int]:
    """Each partition's end of ``topic`` as ``consumer`` sees it (read_committed: the last stable
    offset; read_uncommitted: the high watermark), asked of the brokers now."""
    partitions = sorted(consumer.list_topics(topic, timeout).topics[topic].partitions)
    return {p: partition_end(consumer, TopicPartition(topic, p), timeout) for p in partitions}


def partition_end(consumer: Consumer, partition: TopicPartition, timeout: float) -> int:
    """The partition's end, asked again for up to ``timeout`` while a new topic's leader is not
    known yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return int(consumer.get_watermark_offsets(partition, timeout)[1])
        except KafkaException as e:
            if e.args[0].code() not in _NO_LEADER_YET or time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # the retry interval of a blocking call run in a thread


class StuckTransaction(Exception):
    """The offsets topic cannot be read to its end: a transaction open on it did not end in time."""


def transactional_id(projection: str, lo: int, hi: int) -> str:
    """The producer's ``transactional.id`` for slices ``lo..hi`` of ``projection``."""
    return f"sj.{projection}.{lo}-{hi}"


def slices_of(txn: str, projection: str) -> tuple[int, int] | None:
    """``(lo, hi)`` of a transactional id of ``projection`` (:func:`transactional_id`), else None."""
    prefix = f"sj.{projection}."
    lo, sep, hi = txn.removeprefix(prefix).partition("-")
    if not txn.startswith(prefix) or not sep or not lo.isdigit() or not hi.isdigit():
        return None
    return int(lo), int(hi)


class OffsetsLog:
    """The offsets topic as the producer of slices ``lo..hi`` of ``projection`` reads it.

    ``config``: the client settings (bootstrap servers, login); ``timeout``: the seconds a read
    may go without progress (and each call to the brokers may take)."""

    def __init__(
        self, config: Mapping[str, Any], topic: str, projection: str, lo: int, hi: int, timeout: float,
        instances: Instances,
    ) -> None:  # fmt: skip
        self.instances = instances
        """The publisher's producers: a fencing one is one of them (:mod:`.instances`)."""
        self.config = dict(config)
        self.topic = topic
        self.projection = projection
        self.lo, self.hi = lo, hi
        self.timeout = timeout
        self._consumers: dict[str, Consumer] = {}

    @property
    def consumers(self) -> int:
        """How many consumers the log holds (at most one per isolation level)."""
        return len(self._consumers)

    def _consumer(self, isolation: str) -> Consumer:
        """The log's consumer of ``isolation``, made at its first use: the ends are asked and
        the rows read through it again (was: a new consumer, its connections, for each call)."""
        consumer = self._consumers.get(isolation)
        if consumer is None:
            consumer = self._consumers[isolation] = Consumer({
                **self.config, "group.id": f"sj-offsets-loader.{self.projection}", "isolation.level": isolation,
                "enable.auto.commit": False, "enable.partition.eof": True,
            })  # fmt: skip
        return consumer

    def close(self) -> None:
        """Close the log's consumers (a consumer that fails to close is left to the collector)."""
        consumers, self._consumers = list(self._consumers.values()), {}
        for consumer in consumers:
            with contextlib.suppress(KafkaException, RuntimeError):
                consumer.close()

    def end_open_transactions(self) -> list[str]:
        """End the transactions earlier owners of these slices may have left open (see the
        module's doc); the transactional ids fenced."""
        own = transactional_id(self.projection, self.lo, self.hi)
        stale = sorted(t for t in self._ids_past_stable_offsets() if t != own and self._overlaps(t))
        for txn in stale:
            producer = self.instances.producer(txn)
            self.instances.init(producer, txn, self.timeout)  # aborts its open transaction, fences its producer
            log.warning(
                "Kafka: fenced %s, an earlier producer of slices of %s %d-%d (its open transaction, if any, aborted)",
                txn, self.projection, self.lo, self.hi,
            )  # fmt: skip
        return stale

    def _overlaps(self, txn: str) -> bool:
        span = slices_of(txn, self.projection)
        return span is not None and span[0] <= self.hi and self.lo <= span[1]

    def _ids_past_stable_offsets(self) -> set[str]:
        """The transactional ids of the rows past each partition's last stable offset."""
        with ThreadPoolExecutor(1) as other:  # the two asked at once
            asked = other.submit(self._ends, self._consumer("read_uncommitted"))
            ends = self._ends(self._consumer("read_committed"))
            highs = asked.result()
        tails = {p: (stable, highs[p]) for p, stable in ends.items() if stable < highs[p]}
        if not tails:
            return set()
        ids: set[str] = set()

        def row(m: Message) -> None:
            txn = orjson.loads(m.value() or b"{}").get("txn")
            if isinstance(txn, str):
                ids.add(txn)

        consumer = self._consumer("read_uncommitted")
        self._read(
            consumer, {p: start for p, (start, _) in tails.items()}, {p: hw for p, (_, hw) in tails.items()}, row
        )
        return ids

    def published(self) -> dict[str, int]:
        """The highest published seq_nr of each persistence id of these slices (read_committed,
        up to each partition's high watermark: :class:`StuckTransaction` behind a transaction
        that does not end within ``timeout``)."""
        highs = self._ends(self._consumer("read_uncommitted"))
        seen: dict[str, int] = {}

        def row(m: Message) -> None:
            value = m.value()
            if value is not None:
                r = orjson.loads(value)
                if self.lo <= r["slice"] <= self.hi:
                    seen[r["pid"]] = max(r["seq_nr"], seen.get(r["pid"], 0))

        consumer = self._consumer("read_committed")
        self._read(consumer, dict.fromkeys(highs, OFFSET_BEGINNING), highs, row)
        return seen

    def _ends(self, consumer: Consumer) -> dict[int, int]:
        """Each partition's end of the offsets topic (:func:`topic_ends`)."""
        return topic_ends(consumer, self.topic, self.timeout)

    def _read(
        self, consumer: Consumer, starts: Mapping[int, int], targets: Mapping[int, int], row: Callable[[Message], None]
    ) -> None:  # fmt: skip
        """Hand each record from ``starts`` up to ``targets`` (partition -> offset) to ``row``;
        the consumer is unassigned after (it stops fetching)."""
        pending = {p for p, end in targets.items() if end > 0}
        try:
            consumer.assign([TopicPartition(self.topic, p, starts[p]) for p in pending])
            deadline = time.monotonic() + self.timeout
            while pending:
                if time.monotonic() > deadline:  # nothing came for that long
                    raise self._stuck(consumer, pending, targets)
                for m in consumer.consume(10_000, 0.05):  # it waits for all 10,000 or the timeout
                    deadline = time.monotonic() + self.timeout
                    err = m.error()
                    if err is not None and causes.refused(err):
                        raise KafkaException(err)
                    if err is None:
                        row(m)
                    p = m.partition() or 0
                    at = m.offset() if err is not None and err.code() == KafkaError._PARTITION_EOF else None
                    if at is None:
                        at = consumer.position([TopicPartition(self.topic, p)])[0].offset
                    if at >= targets.get(p, 0):
                        pending.discard(p)
        finally:
            with contextlib.suppress(KafkaException):  # an error of the read is the one to raise
                consumer.unassign()

    def _stuck(self, consumer: Consumer, pending: set[int], targets: Mapping[int, int]) -> Exception:
        """Why the read made no progress: a transaction that does not end, or no answer."""
        p = min(pending)
        try:
            stable = int(consumer.get_watermark_offsets(TopicPartition(self.topic, p), self.timeout)[1])
        except KafkaException as e:
            return e
        if stable < targets[p]:
            return StuckTransaction(
                f"a transaction open on {self.topic} partition {p} since offset {stable} (its high watermark "
                f"{targets[p]}) did not end within {self.timeout:g} s; the transaction coordinator aborts it "
                "after its transaction.timeout.ms (find it: kafka-transactions.sh find-hanging)"
            )
        return KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{self.topic} not read to its end"))
