"""Reading the current durable states into a Spark DataFrame: one JDBC partition per slice range.

As :mod:`.reader` does for events: each Spark partition runs ``SELECT ... FROM durable_state
WHERE entity_type = 'T' AND slice BETWEEN a AND b`` (one range scan of
``durable_state_slice_idx``), on the database that holds the range when the journal is
partitioned (:func:`~.placement.placement`: states live where their slice is served). A state is
one row, its latest revision: the frame is the current state of every pid of the entity type
(tombstones, deleted states, left out unless asked for). :func:`decode_states` reads the payloads
as :func:`~.decode.decode_events` does, through the journal's codec and serializers when given a
:class:`~.payloads.PayloadReader` (decrypted with each subject's key; a forgotten subject's state
flagged).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from journal.errors import InvalidArgument
from journal.ids import slice_ranges, validate_entity_type

from .decode import decode_events
from .jdbc import JdbcSource
from .payloads import PayloadReader
from .placement import SliceSource
from .reader import read_slice_ranges
from .sql import state_predicate

STATE_COLUMNS: tuple[str, ...] = (
    "slice",
    "entity_type",
    "persistence_id",
    "revision",
    "db_timestamp",
    "state_ser_id",
    "state_ser_manifest",
    "state_payload",
    "tags",
)


def state_predicates(entity_type: str, partitions: int, *, include_deleted: bool = False) -> list[str]:
    """One predicate per slice range of ``partitions`` (which must divide 1024), covering every
    slice once."""
    validate_entity_type(entity_type)
    return [
        state_predicate(entity_type, lo, hi, include_deleted=include_deleted) for lo, hi in slice_ranges(partitions)
    ]


def read_states(
    spark: Any,
    source: JdbcSource | Sequence[SliceSource],
    entity_type: str,
    *,
    partitions: int = 8,
    fetch_size: int = 10_000,
    columns: Sequence[str] | None = None,
    include_deleted: bool = False,
) -> Any:
    """The current states of ``entity_type`` as a DataFrame with ``partitions`` slice-range
    partitions (:data:`STATE_COLUMNS`, or ``columns`` of them). ``source``: the journal's
    database, or where each slice range is stored (a partitioned journal's
    :func:`~.placement.placement`). ``include_deleted``: the tombstones too (``state_ser_id`` 0).

    Raises:
        InvalidArgument: bad entity type, partition count or column name (no I/O done).
    """
    if not isinstance(fetch_size, int) or fetch_size < 1:
        raise InvalidArgument(f"fetch_size must be a positive int, got {fetch_size!r}")
    state_predicates(entity_type, partitions)  # checks the arguments
    wanted = list(columns) if columns is not None else list(STATE_COLUMNS)
    unknown = [c for c in wanted if c not in STATE_COLUMNS]
    if unknown or not wanted:
        raise InvalidArgument(f"unknown durable state columns {unknown}: choose from {list(STATE_COLUMNS)}")
    return read_slice_ranges(
        spark, source, "durable_state", partitions, fetch_size, wanted,
        lambda lo, hi: state_predicate(entity_type, lo, hi, include_deleted=include_deleted),
    )  # fmt: skip


def decode_states(
    df: Any, schema: Any | Mapping[str, Any] | None = None, *, sample: int = 1000, payloads: PayloadReader | None = None
) -> Any:
    """``persistence_id``, ``entity_type``, ``slice``, ``revision``, ``db_timestamp``, ``tags``,
    ``state_type`` (the manifest), ``state`` (a struct: ``schema`` for every state, one per state
    type, or None to infer it from ``sample`` payloads) and ``forgotten``, from what
    :func:`read_states` returns (with its payload columns). ``payloads``: read them as the journal
    does (its codec: decrypted, decompressed; its serializers and upcasters), a forgotten
    subject's state with ``forgotten`` true and a null ``state``; without it, JSON payloads are
    parsed as stored and a sealed one fails the job. Tombstones are left out (they have no state).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    needed = {"persistence_id", "revision", "state_ser_id", "state_ser_manifest", "state_payload"}
    missing = sorted(needed - set(df.columns))
    if missing:
        raise InvalidArgument(f"decode_states needs the durable state columns {missing}")
    envelope = [F.col(c) for c in ("persistence_id", "entity_type", "slice", "db_timestamp", "tags") if c in df.columns]
    as_events = df.where(F.col("state_ser_id") != 0).select(
        *envelope,
        F.col("revision").alias("seq_nr"),
        F.col("state_ser_id").alias("event_ser_id"),
        F.col("state_ser_manifest").alias("event_ser_manifest"),
        F.col("state_payload").alias("event_payload"),
        F.lit(None).cast("int").alias("meta_ser_id"),
        F.lit(None).cast("binary").alias("meta_payload"),
    )
    decoded = decode_events(as_events, schema, metadata_schema=StructType([]), sample=sample, payloads=payloads)
    keep = [c for c in ("persistence_id", "entity_type", "slice") if c in df.columns]
    after = [c for c in ("db_timestamp", "tags") if c in df.columns]
    return decoded.select(
        *keep, F.col("seq_nr").alias("revision"), *after, F.col("event_type").alias("state_type"),
        F.col("event").alias("state"), "forgotten",
    )  # fmt: skip
