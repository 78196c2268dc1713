"""One typed settings object, defaults documented beside them.

Build with :meth:`JournalSettings.load`: defaults, then environment (``JOURNAL_<FIELD>`` or
``JOURNAL_<GROUP>_<FIELD>``), then keyword overrides (a leaf name such as ``buffer_size=500`` or
``"query.buffer_size"``). Every value is validated; a bad one raises :class:`ConfigurationError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, get_args

from .errors import ConfigurationError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def validate_identifier(name: str, what: str = "identifier") -> str:
    """SQL identifiers from configuration: letters, digits, underscore; at most 63 characters."""
    if not isinstance(name, str) or not _IDENT.match(name):
        raise ConfigurationError(
            f"{what} {name!r} is not a valid identifier (letters, digits, '_', max 63, not starting with a digit)"
        )
    return name


def _default_data_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("slice-journal")) / "pgdata"


@dataclass(frozen=True)
class ConnectionSettings:
    dsn: str | None = None
    """PostgreSQL DSN. None: use an embedded PostgreSQL under ``data_dir``."""
    schema: str = "public"
    """Schema that holds the journal tables (validated identifier)."""
    data_dir: Path = field(default_factory=_default_data_dir)
    """Data directory of the embedded PostgreSQL (used only without a DSN)."""
    pool_min_size: int = 0
    """Idle connections are kept for reuse anyway; 0 avoids background reconnect loops during outages."""
    pool_max_size: int = 10
    """The journal's pool: reads, small statements, and the projection workers of the process
    (their lease rounds, offset reads and one transaction per slice range being processed; a
    worker over N databases runs a range per database). Group commit writes on connections of its
    own. Fewer than half of it (``(pool_max_size - 1) // 2``, 4 of the default 10) is ever held by
    the workers' transactions at once, the other ranges wait their turn, so a handler's reads of
    the journal inside its transaction (the entities' writers do them) always find a connection:
    more ranges wait rather than hang (docs/projections.md). Raise it to commit more ranges at
    once; a worker on this pool needs at least 3."""
    connect_timeout: float = 10.0
    """Seconds to wait for a server to answer a connection attempt (a silent server, a firewall
    that drops packets) before that attempt counts as failed."""


@dataclass(frozen=True)
class WriteSettings:
    max_batch_events: int = 2000
    """Group commit: at most this many events in one multi-row statement."""
    max_batch_wait: float = 0.0
    """Seconds a batch may wait for more calls; 0 = only what queued while the last batch ran."""
    max_in_flight: int = 2
    """Group commit batches written at once (each on its own connection). With 2 (the default)
    the client wakes one batch's callers and builds their next calls while the server writes
    another batch, which measured fastest on 2 cores (see ``GroupCommit._release``); on Cassandra
    2 measured ~5% faster than 1 (``benchmarks/cassandra_write.py``, one event per call)."""
    bulk_in_flight: int = 2
    """persist_many: statements of one bulk call written at once (on separate connections). A
    call of up to ``max_batch_events`` parts is checked whole, then split into this many (of at
    least 250 parts); a larger one goes in chunks, the client checking the next chunk while the
    server writes the last one."""
    bulk_lock_timeout: float = 1.0
    """persist_many: seconds a bulk statement waits for a row lock another transaction holds;
    then its chunk is set aside and written again once the call's other chunks commit. A bulk
    write keeps its transactions open until its last chunk is written, so two crossing on the
    same pids (each one's first chunk holding rows the other's second waits for) would wait on
    each other forever: the cycle closes through the clients, where PostgreSQL cannot see it."""
    notify: bool = True
    """Send NOTIFY in the write transaction so live queries wake at once."""
    freeze_heap: bool = True
    """At the first open in a process, collect once and ``gc.freeze()`` what is alive then (the
    imported modules, the journal's pools), unless something froze the heap already
    (:func:`journal.runtime.freeze_heap`): the collector's full passes then skip it. False
    leaves the collector alone."""
    writer_id: str | None = None
    """Value of the ``writer`` column (default: a fresh UUID per journal instance)."""
    max_event_bytes: int = 8 * 1024 * 1024
    """An event (or a call's metadata) larger than this once serialized is refused with
    InvalidArgument before any I/O, on every backend. PostgreSQL would store up to 1 GB, at a cost
    of several times that in memory on both sides; Cassandra refuses a request above about 12 MiB
    with its default heap (see ``cassandra.max_write_bytes``). Keep large payloads elsewhere and
    put a reference in the event."""


@dataclass(frozen=True)
class RetrySettings:
    attempts: int = 5
    """Tries for an operation that fails because the database is unreachable."""
    initial_backoff: float = 0.05
    max_backoff: float = 2.0
    budget: float = 20.0
    """Seconds an operation may spend in all its tries: no retry starts after this, and a try that
    timed out (``connection.connect_timeout``) is retried only when a whole new try ends within it.
    So a server that never answers costs at most ``budget``, not ``attempts`` timeouts: with the
    defaults one connect timeout (10 s), since a second would end after 20 s."""

    def backoff(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failures in a row: ``initial_backoff`` doubled per
        failure, at most ``max_backoff``."""
        return min(self.max_backoff, self.initial_backoff * (1 << min(failures, 30)))


QueryMode = Literal["horizon", "backtracking"]


@dataclass(frozen=True)
class QuerySettings:
    buffer_size: int = 1000
    """Rows per page (reference default 1000); the page size at the live tail."""
    catch_up_buffer_size: int = 10000
    """Rows per page while a slice query is far behind its bound (its window ends before the
    bound, or its last page was full): fewer round trips over a backlog. At least buffer_size."""
    refresh_interval: float = 3.0
    """Seconds between polls of an idle live query (reference 3 s)."""
    behind_current_time: float = 0.1
    """Backtracking mode: stay this far behind the database's now (reference 100 ms)."""
    backtracking_window: float = 120.0
    """Backtracking mode: how far behind the live position backtracking reads (reference 2 min)."""
    backtracking_behind_current_time: float = 10.0
    """Backtracking mode: backtracking stays this far behind now (reference 10 s)."""
    mode: QueryMode = "horizon"
    """Late-commit safety: "horizon" (default on PostgreSQL) or "backtracking"."""
    heartbeat_interval: float = 1.0
    """Live queries on quiet ranges advance their offset at least this often (seconds)."""


TagBucketSize = Literal["Day", "Hour", "Minute"]
HandlerRecoveryKind = Literal[
    "fail", "retry-and-fail", "retry-and-skip", "retry-and-dead-letter", "retry-and-dead-letter-sequenced"
]
"""What a projection does with an event its handler keeps failing on (see docs/handler-failures.md)."""


@dataclass(frozen=True)
class TagSettings:
    """Events by tag (defaults from the reference's events-by-tag settings)."""

    bucket_size: TagBucketSize = "Hour"
    """Day | Hour | Minute. Cannot change once tagged data exists (refused at open)."""
    first_time_bucket: str = "20151120T00:00"
    """UTC start of queries without an offset; set it to your first deployment day."""
    max_message_batch_size: int = 150
    """Tag writer: rows per batch (one (tag, bucket) partition per batch)."""
    flush_interval: float = 0.0
    """Tag writer: seconds a row may wait for a fuller batch (0: write when none in flight)."""
    tag_write_timeout: float = 4.0
    """A persist waits this long for its tag rows, then fails (recovery resends them)."""
    max_buffered_events: int = 10_000
    """Tag writer: rows buffered per tag before ``persist`` waits (back-pressure)."""
    retry_initial_backoff: float = 0.1
    """Tag writer: first retry delay after a failed write (doubles up to the max)."""
    retry_max_backoff: float = 2.0
    eventual_consistency_delay: float = 5.0
    """Queries read up to now minus this (seconds); below 2 s is discouraged."""
    gap_timeout: float = 10.0
    """Seconds a query searches for missing events before failing with TagEventsMissing."""
    new_persistence_id_scan_timeout: float = 0.0
    """Seconds to search for earlier events of a pid first seen at a number above 1 (0: accept)."""
    offset_scanning_period: float = 0.2
    """Starting in the current bucket: scan this far ahead to learn each pid's lowest number."""
    back_track_interval: float = 1.0
    """Live queries rescan behind their position this often (seconds)..."""
    back_track_period: float = 5.0
    """...over this many seconds, to pick up events that arrived late."""
    max_missing_to_search: int = 5000
    """A gap larger than this fails at once."""
    query_refresh_interval: float = 3.0
    """Seconds between polls of an idle live events-by-tag query."""
    query_page_size: int = 5000
    """Tag rows fetched per round trip by events-by-tag (catch-up is bound by round trips)."""
    max_message_batch_bytes: int = 4 * 1024 * 1024
    """Tag writer: a batch is also cut at this many payload bytes (one row always fits), so a
    batch of large events stays far below Cassandra's mutation size limit."""


CONSISTENCY_LEVELS = ("ANY", "ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_QUORUM", "EACH_QUORUM", "LOCAL_ONE")
SERIAL_CONSISTENCY_LEVELS = ("SERIAL", "LOCAL_SERIAL")


@dataclass(frozen=True)
class CassandraSettings:
    """The Cassandra backend (defaults from the reference's Cassandra journal where it has one).

    See docs/cassandra-settings.md for the guarantees and trade-offs behind each value."""

    target_partition_size: int = 500_000
    """Events per (persistence_id, partition_nr) partition of ``messages`` (reference default).
    Cannot change once a pid has events; a single persist call holds at most this many events."""
    read_consistency: str = "QUORUM"
    """Consistency level of every read (reference default QUORUM)."""
    write_consistency: str = "QUORUM"
    """Consistency level of every write (reference default QUORUM); with QUORUM reads a read
    sees every acknowledged write."""
    serial_consistency: str = "SERIAL"
    """Paxos consistency of the single-writer check (LOCAL_SERIAL for one-datacenter Paxos)."""
    single_writer_check: bool = True
    """Each write is a lightweight transaction that fails with SequenceConflict when another
    writer took its sequence numbers. False: plain batches, faster, for deployments that
    guarantee one writer per pid (as the reference assumes)."""
    username: str | None = None
    """PasswordAuthenticator user (None: no authentication)."""
    password: str | None = field(default=None, repr=False)
    """Password of ``username`` (kept out of repr)."""
    local_datacenter: str | None = None
    """Datacenter whose nodes serve requests (DC-aware load balancing); None: the driver's default."""
    max_write_bytes: int = 8 * 1024 * 1024
    """A persist call whose events and metadata exceed this many bytes is refused before any I/O.
    The server refuses a request above ``native_transport_max_message_size`` (by default 1/40 of
    its heap: about 12 MiB with a 512 MiB heap) and a mutation above half its commitlog segment
    (16 MiB by default)."""
    request_timeout: float = 10.0
    """Seconds to wait for the cluster connection and for each request's answer."""


@dataclass(frozen=True)
class SparkSettings:
    """Spark pipelines (``projections.spark``): where Spark runs and how it talks JDBC."""

    master: str = "local[*]"
    """Spark master URL; ``local[*]`` runs in this process with one thread per core."""
    jdbc_jar: str | None = None
    """Path of the PostgreSQL JDBC driver jar; None: look in well-known system locations."""
    jdbc_package: str = "org.postgresql:postgresql:42.7.4"
    """Maven coordinates Spark resolves when no jar is found (needs access to Maven Central)."""
    partitions: int = 8
    """Spark partitions of a journal read, one slice range each (must divide 1024)."""
    fetch_size: int = 10_000
    """JDBC rows per round trip when reading."""
    batch_size: int = 10_000
    """JDBC rows per batched INSERT when writing a read model."""
    driver_memory: str = "1g"
    """``spark.driver.memory`` of a session this library starts."""
    executor_memory: str = "1g"
    """``spark.executor.memory`` on a cluster master (at most what each worker offers)."""
    shuffle_partitions: int = 8
    """``spark.sql.shuffle.partitions`` of a session this library starts (small data, small machine)."""


@dataclass(frozen=True)
class ProjectionSettings:
    """Projection workers (offset store, batching, retries, slice leases)."""

    offset_time_window: float = 300.0
    """Seconds of per-pid sequence numbers kept in memory behind each slice's latest offset
    (reference 5 min); older pids are looked up lazily."""
    offset_delete_after: float = 86400.0
    """Offset rows older than this behind their slice's latest row are pruned (reference 1 day);
    the latest row of each slice is always kept. At least ``offset_time_window``."""
    offset_delete_after_consumed: float = 3600.0
    """No offset row consumed (written) less than this many seconds ago is pruned, by either rule
    (Akka Projection 1.6's ``delete-after-consumed``): a projection rebuilt from old events keeps
    its recent rows. Rows a later row of the same pid supersedes are pruned after this too."""
    offset_prune_interval: float = 60.0
    """Seconds between pruning runs of a worker."""
    heartbeat_offset_interval: float = 10.0
    """Idle slices get a heartbeat offset row at most this often (keeps restarts short)."""
    group_size: int = 1000
    """Grouped handler: at most this many envelopes per batch (one transaction)."""
    group_max_wait: float = 0.05
    """Grouped handler: seconds a non-full batch waits for more envelopes."""
    at_least_once_every: int = 100
    """At-least-once: store offsets after this many envelopes..."""
    at_least_once_interval: float = 1.0
    """...or after this many seconds, whichever comes first. The offsets are stored behind the
    handler (it goes on meanwhile); a flush due while the last one is still being stored comes
    when that one ends, with the offsets of every envelope handled by then."""
    handler_attempts: int = 5
    """Tries of a failing batch (rolled back each time) before ``handler_recovery`` acts."""
    handler_recovery: str = "retry-and-fail"
    """Default failure strategy of a projection (each may set its own): ``fail`` (stop at the first
    failure), ``retry-and-fail`` (``handler_attempts`` tries with backoff, then stop),
    ``retry-and-skip`` or ``retry-and-dead-letter`` (then the one poisoned event is isolated and
    skipped, or parked in ``projection_dead_letter``, and the offset moves past it), or
    ``retry-and-dead-letter-sequenced`` (dead-lettered, and every later event of its persistence id
    parked behind it in ``projection_parked_event`` until the dead letter is retried or discarded).
    Projections over a slice range and over a tag take every strategy."""
    handler_backoff: float = 0.2
    """Seconds before the first retry; doubles up to ``handler_max_backoff``."""
    handler_max_backoff: float = 5.0
    lease_ttl: float = 10.0
    """Seconds a slice lease (and a worker's membership) lives without renewal."""
    lease_renew_interval: float = 2.0
    """Seconds between lease renewals and rebalancing checks (well below ``lease_ttl``); after a
    change in the live workers the rounds come quicker (0.05 s, doubling up to this)."""
    queue_size: int = 5000
    """Envelopes read ahead of the handler per slice range."""


@dataclass(frozen=True)
class EntitySettings:
    """Defaults of the entity model (an entity class may override the first four)."""

    state_sync: bool = True
    """True: a command waits while the entity's previous write is in flight (sees current state).
    False: commands run at once against possibly stale state; their writes batch together."""
    snapshot_every: int = 0
    """Save a snapshot automatically every N events (0 = only when a command asks)."""
    passivate_after: float = 120.0
    """Seconds an idle entity stays in memory before it is passivated."""
    replay_batch_size: int = 4096
    """Events read per replay query during recovery (bounds memory; Eventuate's default)."""
    replay_retry_max: int = 3
    """Recovery attempts when the database is unavailable before recovery fails."""
    replay_retry_delay: float = 0.5
    """Seconds between recovery attempts."""
    max_batch_commands: int = 512
    """stateSync=False: at most this many commands' events in one persist call."""
    breaker_failures: int = 2
    """Consecutive failed writes (each already retried by the journal) that open the breaker."""
    breaker_reset_timeout: float = 1.0
    """Seconds the breaker stays open before one trial write (or resolution read) may pass."""
    resolve_max_backoff: float = 2.0
    """Longest wait between attempts to learn the outcome of an interrupted write."""
    redeliver_interval: float = 5.0
    """Seconds between deliveries of an unconfirmed message (``Entity.deliver``)."""
    stash_timeout: float = 60.0
    """Seconds a stashed command may wait to be unstashed before it fails with StashTimeout (0: no limit)."""
    snapshots_per_emitter_max: int = 1
    """Snapshots kept per entity; recovery falls back to an older one if the newest does not load."""


@dataclass(frozen=True)
class TracingSettings:
    """OpenTelemetry spans (docs/tracing.md; extra ``tracing``)."""

    tracing_mode: str = "auto"
    """(env ``JOURNAL_TRACING_MODE``) ``auto``: on when ``opentelemetry-api`` is installed and an
    SDK tracer provider is set when a journal opens; ``on``; ``off`` (then instrumented code reads
    one global and does nothing)."""


@dataclass(frozen=True)
class CodecSettings:
    """Payload compression and encryption (docs/encryption.md). Off by default: payloads are stored
    as serialized, readable by a JVM service that shares the tables."""

    encrypt: bool = False
    """Encrypt event payloads and snapshot states (AES-SIV, a key per subject; extra
    ``encryption``). Metadata is never encrypted."""
    compress_above: int = 0
    """Compress (zlib) payloads larger than this many bytes; 0: never."""
    compression_level: int = 6
    """zlib level, 1 (fast) .. 9 (small)."""
    key_cache_ttl: float = 30.0
    """Seconds a cached data key is used before it is checked with the key store again: a subject
    forgotten by another process stops being readable here within this time."""
    key_cache_size: int = 100_000
    """Data keys kept in memory between calls (least recently used go first). Keys in use (by a
    write or a page being decoded) are kept too, so any size reads and writes correctly."""
    master_key: str | None = None
    """Base64 of 32 bytes: data keys are stored wrapped with it (env ``JOURNAL_CODEC_MASTER_KEY``).
    None: stored as they are (whoever reads the key table can decrypt)."""


@dataclass(frozen=True)
class HookSettings:
    """Your code, by import path ``package.module:attribute`` (docs/projections.md, "Hooks"):
    what the command lines (``--subject-of``, ``--upcasters``, ``--serializers``), Spark's workers
    and :func:`~journal.open_journal` use when not given the object itself. Loaded and checked
    at open, with a one-line error naming the hook (journal/hooks.py)."""

    subject_of: str | None = None
    """(env ``JOURNAL_SUBJECT_OF``) A function ``persistence id -> subject``: whose key encrypts
    a pid's payloads (``codec.encrypt``). None: the pid's own."""
    serializers: str | None = None
    """(env ``JOURNAL_SERIALIZERS``) A ``SerializerRegistry`` (or a function of no arguments
    returning one): your serializers and registered types. None: the built-in one."""
    upcasters: str | None = None
    """(env ``JOURNAL_UPCASTERS``) An ``Upcasters`` (or a function of no arguments returning
    one), added to the registry's: old rows are upgraded on every read. None: the registry's own."""


@dataclass(frozen=True)
class PartitionSettings:
    """A journal over several PostgreSQL databases by slice range (docs/scaling-out.md)."""

    databases: tuple[str, ...] = ()
    """DSNs of the journal's databases (env ``JOURNAL_DATABASES``: separated by spaces). The
    1024 slices split over them in contiguous, equal ranges in this order: with N databases
    (N must divide 1024), database i holds slices ``[i*1024/N, (i+1)*1024/N - 1]``. Empty: one
    database, ``dsn``. With databases, ``dsn`` is the journal's home database (projection
    offsets, read models, leases, dead letters, encryption keys); default: the first one. Their
    passwords are never stored: a database the partition map names (a move's target) gets the
    password of a DSN given here for the same host, port and user, else libpq's password file or
    ``PGPASSWORD`` (docs/scaling-out.md, "Credentials")."""
    fence_wait: float = 30.0
    """Seconds a write to a range that a move is switching (or a delete of a range being moved)
    waits for the move before it fails with JournalUnavailable."""


@dataclass(frozen=True)
class JournalSettings:
    connection: ConnectionSettings = field(default_factory=ConnectionSettings)
    write: WriteSettings = field(default_factory=WriteSettings)
    query: QuerySettings = field(default_factory=QuerySettings)
    retry: RetrySettings = field(default_factory=RetrySettings)
    spark: SparkSettings = field(default_factory=SparkSettings)
    tags: TagSettings = field(default_factory=TagSettings)
    projection: ProjectionSettings = field(default_factory=ProjectionSettings)
    entities: EntitySettings = field(default_factory=EntitySettings)
    cassandra: CassandraSettings = field(default_factory=CassandraSettings)
    codec: CodecSettings = field(default_factory=CodecSettings)
    tracing: TracingSettings = field(default_factory=TracingSettings)
    partitions: PartitionSettings = field(default_factory=PartitionSettings)
    hooks: HookSettings = field(default_factory=HookSettings)

    def __post_init__(self) -> None:
        validate_identifier(self.connection.schema, "schema")
        _positive(self.connection, "pool_max_size", "connect_timeout")
        _non_negative(self.connection, "pool_min_size")
        if self.connection.pool_min_size > self.connection.pool_max_size:
            raise ConfigurationError("pool_min_size must not exceed pool_max_size")
        _positive(self.write, "max_batch_events", "max_in_flight", "bulk_in_flight", "max_event_bytes")
        _positive(self.write, "bulk_lock_timeout")
        _non_negative(self.write, "max_batch_wait")
        _positive(self.retry, "attempts", "initial_backoff", "max_backoff", "budget")
        _positive(self.query, "buffer_size", "catch_up_buffer_size", "refresh_interval", "heartbeat_interval")
        _non_negative(self.query, "behind_current_time", "backtracking_window", "backtracking_behind_current_time")
        _positive(self.spark, "partitions", "fetch_size", "batch_size", "shuffle_partitions")
        if 1024 % self.spark.partitions:
            raise ConfigurationError(f"spark partitions must divide 1024, got {self.spark.partitions}")
        p = self.projection
        _positive(
            p, "offset_time_window", "offset_delete_after", "offset_prune_interval",
            "heartbeat_offset_interval", "group_size", "at_least_once_every", "at_least_once_interval",
            "handler_attempts", "handler_backoff", "handler_max_backoff", "lease_ttl",
            "lease_renew_interval", "queue_size",
        )  # fmt: skip
        _non_negative(p, "group_max_wait", "offset_delete_after_consumed")
        if p.offset_delete_after < p.offset_time_window:
            raise ConfigurationError("offset_delete_after must be at least offset_time_window")
        if p.handler_recovery not in get_args(HandlerRecoveryKind):
            kinds = ", ".join(get_args(HandlerRecoveryKind))
            raise ConfigurationError(f"handler_recovery must be one of {kinds}, got {p.handler_recovery!r}")
        if p.lease_renew_interval * 2 > p.lease_ttl:
            raise ConfigurationError("lease_renew_interval must be at most half of lease_ttl")
        _positive(
            self.entities, "passivate_after", "replay_batch_size", "replay_retry_max",
            "max_batch_commands", "breaker_failures", "breaker_reset_timeout", "resolve_max_backoff",
            "redeliver_interval", "snapshots_per_emitter_max",
        )  # fmt: skip
        _non_negative(self.entities, "snapshot_every", "replay_retry_delay", "stash_timeout")
        if self.query.mode not in get_args(QueryMode):
            raise ConfigurationError(f"query mode must be one of {get_args(QueryMode)}, got {self.query.mode!r}")
        t = self.tags
        if t.bucket_size not in get_args(TagBucketSize):
            raise ConfigurationError(f"tags bucket_size must be one of Day, Hour, Minute; got {t.bucket_size!r}")
        _positive(
            t,
            "max_message_batch_size",
            "tag_write_timeout",
            "max_buffered_events",
            "retry_initial_backoff",
            "retry_max_backoff",
            "gap_timeout",
            "max_missing_to_search",
            "query_refresh_interval",
            "back_track_interval",
        )
        _non_negative(
            t,
            "flush_interval",
            "eventual_consistency_delay",
            "new_persistence_id_scan_timeout",
            "offset_scanning_period",
            "back_track_period",
        )
        _positive(t, "max_message_batch_bytes")
        c = self.cassandra
        _positive(c, "target_partition_size", "max_write_bytes", "request_timeout")
        for name in ("read_consistency", "write_consistency"):
            level = getattr(c, name)
            if level not in CONSISTENCY_LEVELS:
                raise ConfigurationError(f"cassandra {name} must be one of {CONSISTENCY_LEVELS}, got {level!r}")
        if c.serial_consistency not in SERIAL_CONSISTENCY_LEVELS:
            raise ConfigurationError(
                f"cassandra serial_consistency must be one of {SERIAL_CONSISTENCY_LEVELS}, got {c.serial_consistency!r}"
            )
        if (c.username is None) != (c.password is None):
            raise ConfigurationError("cassandra username and password must be set together")
        if self.tracing.tracing_mode not in ("auto", "on", "off"):
            raise ConfigurationError(f"tracing_mode must be auto, on or off; got {self.tracing.tracing_mode!r}")
        _positive(self.codec, "key_cache_ttl", "key_cache_size")
        _non_negative(self.codec, "compress_above")
        if not 1 <= self.codec.compression_level <= 9:
            raise ConfigurationError(f"codec compression_level must be 1..9, got {self.codec.compression_level!r}")
        d = self.partitions.databases
        if not isinstance(d, tuple) or not all(isinstance(x, str) and x.strip() for x in d):
            raise ConfigurationError(f"partitions databases must be a tuple of DSNs, got {d!r}")
        if any(x.count("://") > 1 for x in d):
            raise ConfigurationError(
                "partitions databases (JOURNAL_DATABASES, --databases) has several DSNs in one: "
                "separate the DSNs with spaces, not commas"
            )
        if d and 1024 % len(d):
            raise ConfigurationError(f"the number of databases must divide 1024, got {len(d)}")
        if len(set(d)) != len(d):
            raise ConfigurationError("partitions databases lists a database twice")
        _positive(self.partitions, "fence_wait")
        from .buckets import parse_first_bucket

        parse_first_bucket(t.first_time_bucket, t.bucket_size)

    @property
    def schema(self) -> str:
        return self.connection.schema

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> JournalSettings:
        """Defaults, then ``env`` (default ``os.environ``), then keyword overrides."""
        env = os.environ if env is None else env
        values: dict[str, dict[str, Any]] = {g.name: {} for g in fields(cls)}
        for group in fields(cls):
            for f in fields(group.type if isinstance(group.type, type) else _GROUPS[group.name]):
                for key in _env_names(group.name, f.name):
                    if key in env:
                        values[group.name][f.name] = _coerce(key, env[key], f)
                        break
        _warn_unknown_env(env)
        leaf_owner = _leaf_owners()
        for key, value in overrides.items():
            if value is None and key != "dsn":
                continue
            if "." in key:
                g, _, leaf = key.partition(".")
            else:
                owners = leaf_owner.get(key)
                if not owners:
                    raise ConfigurationError(f"unknown setting {key!r}")
                if len(owners) > 1:
                    raise ConfigurationError(f"ambiguous setting {key!r}: use one of {[o + '.' + key for o in owners]}")
                g, leaf = owners[0], key
            if g not in values or leaf not in {f.name for f in fields(_GROUPS[g])}:
                raise ConfigurationError(f"unknown setting {key!r}")
            f = next(f for f in fields(_GROUPS[g]) if f.name == leaf)
            if isinstance(value, list):
                value = tuple(value)
            values[g][leaf] = _coerce(key, value, f) if isinstance(value, str) else value
        groups = {g: replace(_GROUPS[g](), **v) for g, v in values.items()}
        return cls(**groups)

    def with_dsn(self, dsn: str | None) -> JournalSettings:
        return replace(self, connection=replace(self.connection, dsn=dsn))


_log = logging.getLogger("journal.settings")
_OTHER_ENV = frozenset({"JOURNAL_TEST_DSN"})
"""``JOURNAL_`` variables read by others than the settings (the test suite's server)."""
_warned: set[str] = set()


def _env_names(group: str, name: str) -> tuple[str, str]:
    """The environment variables a setting is read from, the first one winning."""
    return f"JOURNAL_{group}_{name}".upper(), f"JOURNAL_{name}".upper()


def set_in_env(setting: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether ``env`` (default ``os.environ``) sets ``setting`` (``"group.name"``) under either
    name :meth:`JournalSettings.load` reads: a command's own default for it yields to the user's."""
    group, name = setting.split(".")
    env = os.environ if env is None else env
    return any(key in env for key in _env_names(group, name))


def _env_keys() -> list[str]:
    return [key for g, group in _GROUPS.items() for f in fields(group) for key in _env_names(g, f.name)]


def _warn_unknown_env(env: Mapping[str, str]) -> None:
    """A ``JOURNAL_`` variable that names no setting is a typo more often than not: say so once
    per process, with the closest setting, rather than ignore it silently (a warning, not an
    error: an application may use the prefix for variables of its own)."""
    unknown = [k for k in env if k.startswith("JOURNAL_") and k not in _OTHER_ENV and k not in _warned]
    if not unknown:
        return
    known = set(_env_keys())
    for key in unknown:
        if key in known:
            continue
        _warned.add(key)
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]}?)" if close else ""
        _log.warning("environment variable %s names no setting and is ignored%s", key, hint)


_GROUPS: dict[str, type] = {
    "connection": ConnectionSettings,
    "write": WriteSettings,
    "query": QuerySettings,
    "retry": RetrySettings,
    "spark": SparkSettings,
    "tags": TagSettings,
    "projection": ProjectionSettings,
    "entities": EntitySettings,
    "cassandra": CassandraSettings,
    "codec": CodecSettings,
    "tracing": TracingSettings,
    "partitions": PartitionSettings,
    "hooks": HookSettings,
}


def _leaf_owners() -> dict[str, list[str]]:
    owners: dict[str, list[str]] = {}
    for g, t in _GROUPS.items():
        for f in fields(t):
            owners.setdefault(f.name, []).append(g)
    return owners


def _coerce(key: str, raw: Any, f: dataclasses.Field[Any]) -> Any:
    t = str(f.type)
    if not isinstance(raw, str):
        return raw
    try:
        if t == "int":
            return int(raw)
        if t == "float":
            return float(raw)
        if t == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if t == "Path":
            return Path(raw)
        if t == "tuple[str, ...]":
            return tuple(raw.split())
    except ValueError:
        raise ConfigurationError(f"setting {key}={raw!r} is not a valid {t}") from None
    return raw


def _positive(obj: object, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        if not isinstance(v, int | float) or isinstance(v, bool) or v <= 0:
            raise ConfigurationError(f"setting {n} must be > 0, got {v!r}")


def _non_negative(obj: object, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        if not isinstance(v, int | float) or isinstance(v, bool) or v < 0:
            raise ConfigurationError(f"setting {n} must be >= 0, got {v!r}")
