"""Batch projection with hand-over: Spark computes a read model up to a safe cut-off, then the
online workers (``projections run NAME``) continue from exactly there.

The cut-off is the journal's horizon: no event can still commit with a db_timestamp below it.
Spark reads every event of the entity type with ``db_timestamp < horizon``, the job turns them
into a read model, and one transaction then (1) replaces the read model from the staging table,
(2) drops the projection's previous offsets and (3) stores a heartbeat offset at the horizon for
every slice, meaning "every event before this timestamp is processed". A live worker then reads
from the horizon on; a pid it has not seen gets its earlier events checked against that slice
offset, so nothing before the cut-off is applied twice and nothing after it is missed. A run
that fails or is interrupted before that commit leaves the read model and offsets unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from journal.errors import ConfigurationError, InvalidArgument, ProjectionBusy
from journal.ids import NUMBER_OF_SLICES, slice_ranges, validate_entity_type
from journal.journal import Journal

from ..postgres_store import HEARTBEAT_PID, OffsetRow, ProjectionSql
from .decode import decode_events
from .jdbc import JdbcSource
from .payloads import PayloadReader
from .placement import SliceSource
from .reader import read_journal
from .writer import WriteMode, write_read_model


@dataclass(frozen=True)
class ReadModel:
    """What a backfill job returns: the rows and where they go."""

    frame: Any
    table: str
    key: Sequence[str] = ()
    mode: WriteMode = "replace"


Job = Callable[[Any], "ReadModel | Any"]


@dataclass(frozen=True)
class BackfillResult:
    name: str
    cutoff: datetime
    events: int
    partitions: int
    rows_written: int
    table: str
    seconds: float


def load_job(spec: str) -> Job:
    """Import ``package.module:function`` (:func:`journal.hooks.load_object`; clear error when
    missing or not callable)."""
    from journal.hooks import load_object

    fn = load_object(spec, "--job")
    if not callable(fn):
        raise ConfigurationError(f"--job {spec!r} is a {type(fn).__name__}, not a function")
    return fn  # type: ignore[no-any-return]


def heartbeat_rows(cutoff: datetime) -> list[OffsetRow]:
    """One heartbeat offset per slice at ``cutoff``: all events before it are processed."""
    return [OffsetRow(s, HEARTBEAT_PID, 0, cutoff) for s in range(NUMBER_OF_SLICES)]


async def backfill(
    spark: Any,
    journal: Journal,
    source: JdbcSource,
    name: str,
    entity_type: str,
    job: Job,
    *,
    table: str | None = None,
    key: Sequence[str] = (),
    partitions: int = 8,
    fetch_size: int = 10_000,
    batch_size: int = 10_000,
    schema: Any = None,
    placed: Sequence[SliceSource] | None = None,
    payloads: PayloadReader | None = None,
) -> BackfillResult:
    """Run ``job`` over the decoded events below the horizon and hand over to live workers.

    ``job(events)`` gets the decoded DataFrame (see :func:`decode_events`) and returns a
    :class:`ReadModel`, or a DataFrame written to ``table`` with primary key ``key``.
    ``source`` is the journal's (home) database, where the read model and the offsets go;
    ``placed``: where each slice range is read from, for a journal over several databases
    (:func:`~projections.spark.placement.placement`; default: ``source``). ``payloads``: read
    the payloads through the journal's codec, serializers and upcasters (:func:`decode_events`),
    so the job sees the events the online projection sees.

    Raises:
        InvalidArgument: bad name, entity type or partition count (before any Spark work).
        ProjectionBusy: live workers are running this projection.
    """
    validate_entity_type(entity_type)
    if not name or len(name) > 255:
        raise InvalidArgument(f"projection name must be 1..255 characters, got {name!r}")
    slice_ranges(partitions)
    store = ProjectionSql(source.schema)
    await _refuse_if_running(journal, store, name)
    started = time.monotonic()
    cutoff = await journal.horizon(entity_type)
    raw = read_journal(
        spark, placed or source, entity_type, partitions=partitions, fetch_size=fetch_size, to_timestamp=cutoff
    )
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    seen = Observation("events")
    decoded = decode_events(raw, schema, payloads=payloads)  # a schema inference runs its own small sample query
    produced = job(decoded.observe(seen, F.count(F.lit(1)).alias("events")))
    model = produced if isinstance(produced, ReadModel) else _wrap(produced, table, key)

    async def hand_over(conn: Any) -> None:
        if await store.leases.live_workers(conn, name):
            raise ProjectionBusy(f"projection {name!r} has live workers: stop them, then backfill again")
        await store.delete_offsets(conn, name, list(range(NUMBER_OF_SLICES)))
        await store.save_offsets(conn, name, "spark-backfill", heartbeat_rows(cutoff))

    written = await write_read_model(
        model.frame,
        source,
        model.table,
        key=model.key,
        mode=model.mode,
        batch_size=batch_size,
        in_transaction=hand_over,
    )
    events = int(seen.get.get("events", 0))
    return BackfillResult(
        name=name,
        cutoff=cutoff,
        events=events,
        partitions=partitions,
        rows_written=written.rows,
        table=model.table,
        seconds=time.monotonic() - started,
    )


def _wrap(frame: Any, table: str | None, key: Sequence[str]) -> ReadModel:
    if table is None:
        raise InvalidArgument("the job returned a DataFrame: give --table (and --key) or return a ReadModel")
    return ReadModel(frame=frame, table=table, key=tuple(key))


async def _refuse_if_running(journal: Journal, store: ProjectionSql, name: str) -> None:
    import asyncpg

    from journal.postgres import asyncpg_dsn

    dsn = journal.settings.connection.dsn
    if dsn is None:
        return
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        if await store.leases.live_workers(conn, name):
            raise ProjectionBusy(f"projection {name!r} has live workers: stop them, then backfill again")
    finally:
        await conn.close()
