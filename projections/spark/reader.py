"""Reading the journal into a Spark DataFrame: one JDBC partition per slice range.

Each Spark partition runs ``SELECT <columns> FROM event_journal WHERE entity_type = 'T' AND
slice BETWEEN a AND b [AND db_timestamp window]``: the same split the online workers use, so
each partition is one index range scan of ``event_journal_slice_idx`` and a backfill's
partitions line up with the live workers' slice ranges. Over several databases
(:mod:`.placement`), each partition runs on the database that holds its range: one JDBC read
per database, their partitions united.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from journal.errors import InvalidArgument
from journal.ids import slice_ranges, validate_entity_type

from .jdbc import JdbcSource
from .placement import SliceSource, spark_ranges
from .sql import slice_predicate

JOURNAL_COLUMNS: tuple[str, ...] = (
    "slice",
    "entity_type",
    "persistence_id",
    "seq_nr",
    "db_timestamp",
    "event_ser_id",
    "event_ser_manifest",
    "event_payload",
    "deleted",
    "writer",
    "adapter_manifest",
    "tags",
    "meta_ser_id",
    "meta_ser_manifest",
    "meta_payload",
)


def journal_predicates(
    entity_type: str,
    partitions: int,
    from_timestamp: datetime | None = None,
    to_timestamp: datetime | None = None,
    *,
    include_deleted: bool = False,
) -> list[str]:
    """One predicate per slice range; ``partitions`` must divide 1024.

    Together they cover every slice exactly once: the ranges are those of
    :func:`journal.slice_ranges`, disjoint and contiguous from 0 to 1023.
    """
    validate_entity_type(entity_type)
    if from_timestamp is not None and to_timestamp is not None and from_timestamp >= to_timestamp:
        raise InvalidArgument(f"empty time window: from {from_timestamp} is not before to {to_timestamp}")
    return [
        slice_predicate(entity_type, lo, hi, from_timestamp, to_timestamp, include_deleted=include_deleted)
        for lo, hi in slice_ranges(partitions)
    ]


def read_journal(
    spark: Any,
    source: JdbcSource | Sequence[SliceSource],
    entity_type: str,
    *,
    partitions: int = 8,
    fetch_size: int = 10_000,
    from_timestamp: datetime | None = None,
    to_timestamp: datetime | None = None,
    columns: Sequence[str] | None = None,
    include_deleted: bool = False,
) -> Any:
    """The events of ``entity_type`` as a DataFrame with ``partitions`` slice-range partitions.

    ``source``: the journal's database, or where each slice range is stored
    (:func:`~projections.spark.placement.placement`: a journal over several databases); then
    each range of ``partitions`` is read from the database holding it (cut in two where a range
    spans two databases). ``columns``: the journal columns to read (default: all); Spark pushes
    the projection into each partition's SELECT. The time window is ``[from_timestamp, to_timestamp)``.

    Raises:
        InvalidArgument: bad entity type, partition count, window or column name (no I/O done).
    """
    if not isinstance(fetch_size, int) or fetch_size < 1:
        raise InvalidArgument(f"fetch_size must be a positive int, got {fetch_size!r}")
    journal_predicates(entity_type, partitions, from_timestamp, to_timestamp)  # checks the arguments
    wanted = list(columns) if columns is not None else list(JOURNAL_COLUMNS)
    unknown = [c for c in wanted if c not in JOURNAL_COLUMNS]
    if unknown or not wanted:
        raise InvalidArgument(f"unknown journal columns {unknown}: choose from {list(JOURNAL_COLUMNS)}")
    return read_slice_ranges(
        spark, source, "event_journal", partitions, fetch_size, wanted,
        lambda lo, hi: slice_predicate(
            entity_type, lo, hi, from_timestamp, to_timestamp, include_deleted=include_deleted
        ),
    )  # fmt: skip


def read_slice_ranges(
    spark: Any, source: JdbcSource | Sequence[SliceSource], table: str, partitions: int, fetch_size: int,
    columns: Sequence[str], predicate: Callable[[int, int], str],
) -> Any:  # fmt: skip
    """``columns`` of ``table`` with one JDBC partition per slice range of ``partitions`` (cut
    where the database changes), each reading ``predicate(min_slice, max_slice)`` on the
    database that holds the range; one JDBC read per database, their partitions united."""
    placed = [SliceSource(source, 0, 1023)] if isinstance(source, JdbcSource) else list(source)
    by_database: dict[str, tuple[JdbcSource, list[str]]] = {}
    for r in spark_ranges(placed, partitions):
        by_database.setdefault(r.source.url, (r.source, []))[1].append(predicate(r.min_slice, r.max_slice))
    frames = [
        spark.read.jdbc(
            url=db.url,
            table=db.table(table),
            predicates=predicates,
            properties=db.with_properties(fetchsize=str(fetch_size)),
        ).select(*columns)
        for db, predicates in by_database.values()
    ]
    return functools.reduce(lambda a, b: a.union(b), frames)
