"""A projection handler that publishes each event as one Kafka record (docs/kafka.md).

:class:`KafkaPublisher` is a ``grouped`` handler: the projection's workers, slice ranges, offsets,
failure strategies and metrics are the runner's. Each event becomes one record keyed by its
persistence id (so each id's events stay in order in one partition), its value the event as JSON,
its headers ``pid``, ``seq_nr``, ``slice``, ``db_timestamp`` and ``manifest``.

Exactly once (the default): each owned slice range publishes through its own transactional
producer, ``transactional.id`` = ``sj.<projection>.<lo>-<hi>``, so a newer owner of the range fences
an older one at the broker. A batch's records and, for each of its persistence ids, the highest
sequence number published, go to the topic and to a compacted offsets topic in ONE Kafka
transaction; a range's producer reads those back (read_committed) when it starts and skips what
is already published. The runner's PostgreSQL offsets, committed after the Kafka transaction,
only say where to start reading: when a worker dies between the two commits, the events it
published come again and are skipped. ``exactly_once=False``: an idempotent producer flushes each
batch before the runner commits its offsets (at least once: a crash between the two repeats it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka import TopicCollection as Topics
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._acl import AclOperation
from confluent_kafka.cimpl import NewTopic

from journal.envelope import EventEnvelope
from journal.errors import (
    ConfigurationError,
    DestinationRefused,
    DestinationUnavailable,
    KafkaPublishError,
    LeaseLost,
)

from .. import range_context
from . import causes
from .instances import Instances
from .offsets_log import OffsetsLog, StuckTransaction, transactional_id
from .records import Record, RecordBuilder, Serializer, json_value

ANSWER_WITHIN = 2.0
"""Seconds the publisher waits for the brokers' metadata before a range's first batch (and at the
command line's start) before it calls them unavailable: the batch is then retried as an outage
(:class:`DestinationUnavailable`), so this is how long one try keeps the batch's transaction open."""

CLIENT_DEFAULTS: dict[str, Any] = {"enable.sparse.connections": False}
"""librdkafka settings of every client of the publisher (its producers, the offsets topic's
consumers, the topic check's admin client) unless ``config`` sets them: each connects to every
broker of the cluster at once. With sparse connections (librdkafka's default) a new client drops
its bootstrap connection after the first metadata answer and connects to the broker it learnt of
only ~50 ms later (``reconnect.backoff.ms`` / 2): every new client's first answer took 55-60 ms
instead of 3-7 ms, a transactional producer's ``init_transactions`` 60 ms instead of 8
(docs/kafka-speed-history.md, "Every new client waited 50 ms")."""

PRODUCER_DEFAULTS: dict[str, Any] = {"linger.ms": 5, "delivery.report.only.error": True}
"""librdkafka settings of the publisher's producers unless ``config`` sets them: a short linger
gathers records into batches; delivery reports (a Python call each) only for failed records."""


def offsets_topic_for(projection: str) -> str:
    """The default compacted topic of a projection's published sequence numbers."""
    return f"sj-offsets.{projection}"


class _Range:
    """One owned slice range's producer and what it has published."""

    def __init__(self, owned: range_context.OwnedRange, publisher: KafkaPublisher) -> None:
        self.owned = owned
        self.p = publisher
        self.published: dict[str, int] = {}
        self.builder = RecordBuilder(publisher.value)
        self.txn = transactional_id(owned.projection, owned.lo, owned.hi)
        self.generation = 0
        """The count of this process's initializations of the transactional id at this one's."""
        self.first_error: KafkaError | None = None
        """The first failed delivery of this range's records since the last look."""
        if publisher.exactly_once:
            self.producer = publisher.instances.producer(self.txn)
        else:
            self.producer = Producer(publisher.producer_config)

    async def open(self) -> None:
        if not self.p.exactly_once:
            await asyncio.to_thread(self._connect)
            return
        instances = self.p.instances
        log = OffsetsLog(self.p.client_config, self.p.offsets_topic, *self._slices(), self.p.timeout, instances)
        try:  # fences the range's older producer; meanwhile the earlier owners' (other ids) are ended
            generation, ended, _ = await asyncio.gather(
                asyncio.to_thread(instances.init, self.producer, self.txn, self.p.timeout),
                asyncio.to_thread(log.end_open_transactions),
                asyncio.to_thread(self._ask_metadata),  # unanswered: init_transactions says so
                return_exceptions=True,  # all ended before an error is raised
            )
            if isinstance(generation, BaseException):
                raise generation
            if isinstance(ended, BaseException):
                raise ended
            self.generation = generation
            self.published = await asyncio.to_thread(log.published)  # only now: no fenced producer commits
        except KafkaException as e:
            raise self._failed_to_open(e) from None
        except StuckTransaction as e:
            self.p.drop(self)
            servers = self.p.config["bootstrap.servers"]
            raise DestinationUnavailable(f"Kafka at {servers}: {e}", destination="Kafka") from None
        finally:
            await asyncio.to_thread(log.close)
        self.p.refusals.clear()

    def _connect(self) -> None:
        """An at-least-once range's start: :meth:`_ask_metadata`, its failure raised (brokers that
        do not answer within :data:`ANSWER_WITHIN`: an outage)."""
        try:
            self._ask_metadata()
        except KafkaException as e:
            raise self._failed_to_open(e) from None

    def _ask_metadata(self) -> None:
        """Ask for the topic's metadata twice: librdkafka asks for a producer's id when a metadata
        answer comes while a broker it learnt of is connected, else on a 500 ms timer, and the first
        answer comes over the bootstrap connection. Measured: an idempotent producer's first batch
        delivered after ~60 ms instead of ~500 ms; ``init_transactions`` took 60-70 ms, and 510 ms in
        3 of 8 tries without (docs/kafka-speed-history.md, "The start, step by step")."""
        for _ in range(2):
            self.producer.list_topics(self.p.topic, timeout=ANSWER_WITHIN)

    def _failed_to_open(self, e: KafkaException) -> Exception:
        """:meth:`_failed` for an error while the range opens, after serving the producer's error
        callback, where a refused login is said."""
        with contextlib.suppress(KafkaException):  # a fatal error raises here too
            self.producer.poll(0)
        return self._failed(e.args[0])

    def _slices(self) -> tuple[str, int, int]:
        return self.owned.projection, self.owned.lo, self.owned.hi

    async def publish(self, envelopes: Sequence[EventEnvelope]) -> None:
        fresh = [e for e in envelopes if e.seq_nr > self.published.get(e.persistence_id, 0)]
        if not fresh:
            return
        if not self.p.exactly_once:
            await self._produce_all(fresh)
            await self._flush()
            return
        try:
            self.producer.begin_transaction()
        except KafkaException as begin_error:
            raise self._failed(begin_error.args[0]) from None
        try:  # the offsets' rows first: they name the transaction to a next owner (offsets_log)
            last = {e.persistence_id: e for e in fresh}
            rows: list[Record] = [
                (pid.encode(), orjson.dumps({"pid": pid, "slice": e.slice, "seq_nr": e.seq_nr, "txn": self.txn}), [])
                for pid, e in last.items()
            ]
            await self._produce_records(self.p.offsets_topic, rows)
            await self._produce_all(fresh)
            await self._call(self.producer.commit_transaction, self.p.timeout)
        except DestinationUnavailable:
            raise  # the producer is forgotten: the next one's init_transactions ends what it left open
        except BaseException:
            await self._abort()
            raise
        self.p.refusals.clear()
        for pid, e in last.items():
            self.published[pid] = e.seq_nr

    async def _produce_all(self, envs: Sequence[EventEnvelope]) -> None:
        await self._produce_records(self.p.topic, self.builder.records(envs))

    async def _produce_records(self, topic: str, records: Iterable[Record]) -> None:
        """Hand each record to the producer as it is built (its ``produce`` copies it and does not
        block, so no batch of records is held); only when its local queue is full is there a wait,
        in a thread, for deliveries to drain it."""
        pending = iter(records)
        left = self._produce_until_full(topic, pending)
        while left is not None:
            await asyncio.to_thread(self.producer.poll, 0.1)
            left = self._produce_until_full(topic, itertools.chain([left], pending))

    def _produce_until_full(self, topic: str, records: Iterator[Record]) -> Record | None:
        """Produce ``records`` until the local queue is full; the record that did not fit, if any."""
        produce, delivered = self.producer.produce, self._delivered
        for record in records:
            key, value, headers = record
            try:
                produce(topic, value, key, headers=headers or None, on_delivery=delivered)
            except BufferError:
                return record
            except KafkaException as e:
                if causes.refused(e.args[0]):
                    raise self.p.refused(e.args[0], f"records for {topic!r}") from None
                raise KafkaPublishError(f"Kafka refused a record for {topic!r}: {e.args[0].str()}") from None
        return None

    def _delivered(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None and self.first_error is None:
            self.first_error = err

    async def _flush(self) -> None:
        left = await asyncio.to_thread(self.producer.flush, self.p.timeout)
        err, self.first_error = self.first_error, None
        if err is not None:
            err = self.p.refusals.cause(err)
            if causes.refused(err):
                raise self.p.refused(err, f"records for {self.p.topic!r}")
            if causes.unavailable(err):
                raise self.p.unavailable(err)
            raise KafkaPublishError(f"Kafka did not take a record for {self.p.topic!r}: {err.str()}")
        if left:
            raise self.p.unavailable(
                None, f"{left} records for {self.p.topic!r} not delivered within {self.p.timeout} s"
            )
        self.p.refusals.clear()

    async def _abort(self) -> None:
        try:
            await asyncio.to_thread(self.producer.abort_transaction, self.p.timeout)
        except KafkaException:  # fenced or fatal: this producer is done; the next batch opens a new one
            self.p.drop(self)

    async def _call(self, op: Callable[[float], Any], seconds: float) -> None:
        try:
            await asyncio.to_thread(op, seconds)
        except KafkaException as e:
            raise self._failed(e.args[0]) from None

    def _failed(self, err: KafkaError) -> Exception:
        """The error to raise for a failed transaction call, by its cause (the first failed
        delivery's when there is one; :mod:`.causes`): refused, unavailable (the producer is
        forgotten: the next try opens a new one, which settles the transaction left open), or this
        batch's failure. A fenced or fatally failed producer is forgotten too."""
        err_of_delivery, self.first_error = self.first_error, None
        cause = self.p.refusals.cause(err_of_delivery or err)
        if causes.unavailable(cause) and err_of_delivery is not None and not causes.unavailable(err):
            cause = err  # a delivery timed out; the call's own error says more
        if err.code() in causes.FENCED:
            return self._fenced(err)
        if err.fatal() or causes.unavailable(cause):
            self.p.drop(self)
        if causes.refused(cause):
            return self.p.refused(cause, f"projection {self.owned.projection} slices {self.owned.key}")
        if causes.unavailable(cause):
            return self.p.unavailable(cause)
        return KafkaPublishError(
            f"Kafka transaction of {self.owned.projection} slices {self.owned.key} failed: {cause.str()}"
        )

    def _fenced(self, err: KafkaError) -> Exception:
        """A newer producer of the transactional id fenced this one (it is forgotten): one of this
        process, opened for a retry after an outage, and the batch is redone through a new one
        (an outage, not a failure of the batch); or another worker's, which publishes these slices
        now: this worker stops processing them (:class:`LeaseLost`)."""
        self.p.drop(self)
        what = f"the Kafka producer of {self.owned.projection} slices {self.owned.key}"
        if self.p.instances.newer_than(self.txn, self.generation):
            return DestinationUnavailable(
                f"{what} was fenced by a newer one of this process (opened after an outage): the batch is redone",
                destination="Kafka",
            )
        return LeaseLost(f"{what} was fenced by another worker's ({err.str()}): it publishes these slices now")


class KafkaPublisher:
    """A grouped projection handler publishing each event to ``topic`` (see the module's doc).

    ``config``: librdkafka settings added to ``bootstrap.servers`` (e.g. security; over
    :data:`CLIENT_DEFAULTS`); ``value``:
    the event to the record's value (default: JSON, as the journal stores it); ``offsets_topic``:
    the compacted topic of the published sequence numbers (exactly-once; created when missing).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        exactly_once: bool = True,
        offsets_topic: str | None = None,
        value: Serializer | None = None,
        config: Mapping[str, Any] | None = None,
        timeout: float = 30.0,
    ) -> None:
        if not topic:
            raise ConfigurationError("the Kafka topic must not be empty")
        self.topic = topic
        self.exactly_once = exactly_once
        self._offsets_topic = offsets_topic
        self.value: Serializer = value or json_value
        self.config: dict[str, Any] = {**CLIENT_DEFAULTS, "bootstrap.servers": bootstrap_servers, **(config or {})}
        """The client settings every client of the publisher shares (producers, the offsets' reader)."""
        self.refusals = causes.Refusals()
        """The clients' error callback: the last refused login or permission they reported."""
        self.client_config: dict[str, Any] = {**self.config, "error_cb": self.refusals}
        self.producer_config: dict[str, Any] = {**PRODUCER_DEFAULTS, **self.client_config}
        if not exactly_once:
            self.producer_config.setdefault("enable.idempotence", True)
        self.instances = Instances(self.producer_config)
        """The transactional producers of this process by id (:mod:`.instances`)."""
        self.timeout = timeout
        self._ranges: dict[range_context.OwnedRange, _Range] = {}
        self._retired: set[Producer] = set()
        """The producers of dropped ranges, closed after the next range opens (the brokers answer
        then) or by :meth:`close`; not one whose initialization goes on (:mod:`.instances`)."""
        self._opening: dict[range_context.OwnedRange, asyncio.Task[_Range]] = {}
        """Ranges whose producer opens ahead of their first batch (:meth:`range_started`)."""
        self._busy: set[Producer] = set()
        """Producers whose range is opening (their calls run in threads): never closed meanwhile."""
        self._checked = False

    @property
    def offsets_topic(self) -> str:
        owned = next(iter(self._ranges), None) or range_context.current()
        return self._offsets_topic or offsets_topic_for(owned.projection if owned else "default")

    async def __call__(self, conn: Any, envelopes: Sequence[EventEnvelope]) -> None:
        owned = range_context.current()
        if owned is None:
            raise ConfigurationError("KafkaPublisher is a projection handler: run it on a projection worker")
        opening = self._opening.pop(owned, None)
        channel = await opening if opening is not None else self._ranges.get(owned)
        if channel is None:  # not told of the range, or its opening failed: open it now
            channel = await self._open(owned)
        await channel.publish(envelopes)

    def range_started(self, owned: range_context.OwnedRange) -> None:
        """Open the range's producer now, while its processor loads the range's offsets and reads
        its first page (:class:`~projections.range_context.RangeStarts`): the first batch waits for
        it, and fails as it would have if the opening failed. The range's earlier owner is fenced
        at once, not at its new owner's first batch. Measured in the benchmark: the first batch
        committed after a median 0.37 s of the workers' start instead of 0.42-0.47 s (docs/kafka.md,
        "Speed")."""
        if owned in self._ranges or owned in self._opening:
            return
        earlier = [o for o in self._opening if _overlap(o, owned)]
        task = asyncio.create_task(
            self._open(owned, after=[self._opening.pop(o) for o in earlier]),
            name=f"opening the Kafka producer of {owned.projection} slices {owned.key}",
        )
        task.add_done_callback(_retrieved)  # raised again at the first batch
        self._opening[owned] = task

    async def _open(self, owned: range_context.OwnedRange, after: Sequence[asyncio.Task[_Range]] = ()) -> _Range:
        """Open ``owned``'s producer, once the earlier processors' openings of its slices ended."""
        await asyncio.gather(*after, return_exceptions=True)
        for old in [r for r in self._ranges.values() if _overlap(r.owned, owned)]:
            self.drop(old)  # an earlier processor of these slices in this process: it has stopped
        if not self._checked:
            await self.check(owned.projection)
        channel = _Range(owned, self)
        self._ranges[owned] = channel
        self._busy.add(channel.producer)
        try:
            await channel.open()
        except BaseException:
            self.drop(channel)
            raise
        finally:
            self._busy.discard(channel.producer)
        if self._retired:
            await asyncio.to_thread(close_producers, self._done_with())
        return channel

    def _done_with(self) -> set[Producer]:
        """The dropped ranges' producers no range uses, none opening and none to be initialized
        again, forgotten."""
        live = {r.producer for r in self._ranges.values()} | self._busy
        done = {p for p in self._retired if p not in live and not self.instances.holds(p)}
        self._retired -= done
        return done

    async def check(self, projection: str) -> None:
        """Fail now, in one line, when the topic is missing (:class:`ConfigurationError`) or the
        brokers do not answer within :data:`ANSWER_WITHIN` (:class:`DestinationUnavailable`)."""
        await asyncio.to_thread(self._check_topics, projection)
        self._checked = True

    def _check_topics(self, projection: str) -> None:
        """The topic must exist (one line naming it otherwise); the offsets topic is created compacted."""
        try:  # its refused connections: in the error raised
            admin = AdminClient({"log_level": 2, **self.client_config})
        except KafkaException as e:  # a setting librdkafka does not know, or a wrong value
            raise ConfigurationError(f"Kafka client settings: {e.args[0].str()}") from None
        offsets = self._offsets_topic or offsets_topic_for(projection)
        try:
            topics = admin.list_topics(timeout=ANSWER_WITHIN).topics
            self._check_access(admin, topics)
            self.refusals.clear()
        except KafkaException as e:
            with contextlib.suppress(KafkaException):
                admin.poll(0)  # serves the error callback: a refused login is said there
            cause = self.refusals.cause(e.args[0])
            if causes.refused(cause):
                what = "the login" if causes.login_refused(cause) else f"the topic {self.topic!r}"
                raise self.refused(cause, what) from None
            if causes.unavailable(cause):
                raise self.unavailable(cause) from None
            servers = self.config["bootstrap.servers"]
            raise KafkaPublishError(f"Kafka at {servers} did not answer: {cause.str()}") from None
        if self.topic not in topics:
            raise ConfigurationError(f"the Kafka topic {self.topic!r} does not exist (create it first)")
        if self.exactly_once and offsets not in topics:
            new = NewTopic(offsets, 1, -1, config={"cleanup.policy": "compact"})
            for future in admin.create_topics([new]).values():
                try:
                    future.result(self.timeout)
                except KafkaException as e:
                    if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                        raise KafkaPublishError(
                            f"cannot create the offsets topic {offsets!r}: {e.args[0].str()}"
                        ) from None

    def _check_access(self, admin: AdminClient, topics: Mapping[str, Any]) -> None:
        """A topic the client may not see or write: :class:`DestinationRefused` now (one line)."""
        meta = topics.get(self.topic)
        if meta is None:  # not listed: missing, or hidden from this client; asked by name, it says which
            meta = admin.list_topics(self.topic, timeout=ANSWER_WITHIN).topics.get(self.topic)
        if meta is not None and meta.error is not None and causes.refused(meta.error):
            raise KafkaException(meta.error)
        if meta is None or meta.error is not None:
            return
        described = admin.describe_topics(Topics([self.topic]), include_authorized_operations=True)
        operations = described[self.topic].result(self.timeout).authorized_operations or []
        if operations and AclOperation.WRITE not in operations and AclOperation.ALL not in operations:
            raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

    def unavailable(self, err: KafkaError | None, text: str = "") -> DestinationUnavailable:
        """The brokers do not answer: an outage the runner waits out (docs/kafka.md)."""
        servers = self.config["bootstrap.servers"]
        said = text or (err.str() if err is not None else "no answer")
        return DestinationUnavailable(f"Kafka at {servers} does not answer: {said}", destination="Kafka")

    def refused(self, err: KafkaError, what: str) -> DestinationRefused:
        """The brokers refuse the projection's login or permissions: it stops (docs/kafka.md)."""
        servers = self.config["bootstrap.servers"]
        return DestinationRefused(f"Kafka at {servers} refused {what}: {err.str()} ({causes.hint(err)})")

    def drop(self, channel: _Range) -> None:
        """Forget a range's producer (fenced, failed, or its processor stopped)."""
        if self._ranges.get(channel.owned) is channel:
            del self._ranges[channel.owned]
            self._retired.add(channel.producer)

    async def close(self) -> None:
        """Close every range's producer and those of dropped ranges, once the workers have stopped.
        Nothing is flushed: each batch delivered (at least once) or committed (exactly once) its
        records before its worker moved its offsets, and what a failed batch left queued is published
        again when the batch is retried, so closing during an outage does not wait for the brokers
        (but for a range's opening under way, which ends within ``timeout``)."""
        opening, self._opening = list(self._opening.values()), {}
        await asyncio.gather(*opening, return_exceptions=True)
        for channel in list(self._ranges.values()):
            self.drop(channel)
        retired, self._retired = self._retired, set()
        await asyncio.to_thread(close_producers, retired)


def _overlap(a: range_context.OwnedRange, b: range_context.OwnedRange) -> bool:
    return a.lo <= b.hi and b.lo <= a.hi


def _retrieved(task: asyncio.Task[Any]) -> None:
    """A range's opening ended: its error is raised again at the range's first batch, or never
    (the range stopped first), so it is not logged as an error nobody retrieved."""
    if not task.cancelled():
        task.exception()


def close_producers(producers: Iterable[Producer]) -> None:
    """Close each producer, quickly and whatever state it is in: ``close`` waits for every queued
    record (so they are purged first) and aborts an open transaction, which a fenced producer
    cannot: it says so in a RuntimeWarning (not shown) or raises its fatal error (ignored). Its
    transaction is the broker's to end, and a producer being closed owes nothing more."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Producer abort_transaction failed during close", RuntimeWarning)
        for producer in producers:
            with contextlib.suppress(KafkaException):
                producer.purge()
            with contextlib.suppress(KafkaException):
                producer.close()
