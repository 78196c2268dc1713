"""``projections spark-backfill`` and ``projections spark-export``: :func:`register` adds them to
the ``projections`` app (this module does not import that app: it sits below it).

Importing this module does not import pyspark: the commands do, when they run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from journal.cli.common import (
    DatabasesOption,
    DataDirOption,
    DsnOption,
    SchemaOption,
    SerializersOption,
    SubjectOfOption,
    UpcastersOption,
    hook_settings,
    journal_hooks,
)

from ..entity_types import check_entity_type

EntityTypeOption = Annotated[str, typer.Option("--entity-type", help="Entity type whose events are read.")]
PartitionsOption = Annotated[
    int | None, typer.Option("--partitions", help="Spark partitions = slice ranges (divides 1024; default 8).")
]
MasterOption = Annotated[
    str | None, typer.Option("--master", help="Spark master (default local[*]; e.g. spark://host:7077).")
]


@dataclasses.dataclass(frozen=True)
class _Source:
    """What both commands read: the settings (the home database's DSN in them), that database's
    JDBC source and the journal's hooks."""

    settings: Any
    jdbc: Any
    hooks: dict[str, Any]

    @contextlib.asynccontextmanager
    async def journal(self, entity_type: str) -> AsyncIterator[Any]:
        """The journal opened as its services open it, once it is known to hold ``entity_type``."""
        from journal.journal import open_journal

        async with open_journal(self.settings.connection.dsn, settings=self.settings, **self.hooks) as j:
            await check_entity_type(j, entity_type)
            yield j


def _prepare(
    dsn: str | None, schema: str | None, data_dir: Path | None, databases: str | None, master: str | None,
    partitions: int | None, hooked: dict[str, Any],
) -> _Source:  # fmt: skip
    """The options of both commands read: the settings, the home database's DSN and its JDBC
    source (which needs a TCP route for a cluster), the hooks loaded."""
    from journal.cli.common import settings_from, target_dsn

    from .environment import runs_on_this_host
    from .jdbc import jdbc_source

    settings = settings_from(schema, data_dir, databases, master=master, partitions=partitions, **hooked)
    target, _embedded = target_dsn(dsn, settings)
    settings = settings.with_dsn(target)
    source = jdbc_source(target, settings.schema, local=runs_on_this_host(settings.spark.master))
    return _Source(settings, source, journal_hooks(settings))


async def _placed(journal: Any, settings: Any) -> Any:
    """Where each slice range is read from: the database holding it (docs/scaling-out.md)."""
    from .environment import runs_on_this_host
    from .placement import placement

    return await placement(journal, local=runs_on_this_host(settings.spark.master))


async def _payloads(journal: Any, source: Any) -> Any:
    """How the workers read the payloads: through the journal's codec, serializers and upcasters
    when it has any of them or holds sealed rows (else Spark parses the stored JSON itself).
    Encrypted rows without the codec's settings are refused in one line, before Spark starts."""
    from journal.errors import ConfigurationError

    from .payloads import PayloadReader

    sealed = {flag for r in await journal.stored_manifests() if r.kind == "event" for flag in r.sealed}
    registry = journal.serializers
    if "e" in sealed and not registry.keyed:
        raise ConfigurationError(
            "the journal holds encrypted events: read them with codec.encrypt on (JOURNAL_CODEC_ENCRYPT=1, "
            "and JOURNAL_CODEC_MASTER_KEY if it was set when they were written), or export them as stored (--raw)"
        )
    if sealed or registry.codec is not None or registry.upcasters or journal.settings.hooks.serializers:
        return PayloadReader.of(journal, source)
    return None


@contextlib.contextmanager
def _worker_errors() -> Iterator[None]:
    """A failure in Spark's Python workers (a payload the journal cannot read, an upcaster that
    raises) as one line: the worker's own error, not the JVM's stack around it."""
    from pyspark.errors import PythonException

    from journal.errors import SerializationError

    try:
        yield
    except PythonException as e:
        causes = [line for line in str(e).splitlines() if _ERROR_LINE.match(line)]
        if not causes:
            raise
        raise SerializationError(f"a Spark worker failed: {causes[-1]}") from e


_ERROR_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Forgotten): ")
"""The last line of a Python traceback: ``module.ErrorType: message``."""


def _say(msg: str) -> None:
    typer.echo(msg, err=not sys.stdout.isatty())


def spark_backfill(
    name: Annotated[str, typer.Argument(help="Projection name (the one `projections run` uses).")],
    entity_type: EntityTypeOption,
    job: Annotated[str, typer.Option("--job", help="package.module:function(events) -> ReadModel | DataFrame.")],
    table: Annotated[str | None, typer.Option("--table", help="Target table when the job returns a DataFrame.")] = None,
    key: Annotated[list[str] | None, typer.Option("--key", help="Primary key column (repeatable).")] = None,
    partitions: PartitionsOption = None,
    master: MasterOption = None,
    dsn: DsnOption = None,
    databases: DatabasesOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
    subject_of: SubjectOfOption = None,
    upcasters: UpcastersOption = None,
    serializers: SerializersOption = None,
) -> None:
    """Compute a read model with Spark up to the journal's horizon, write it, and store the
    projection's offsets there so `projections run NAME` continues from exactly that point."""
    from .backfill import backfill, load_job
    from .environment import spark_session

    fn = load_job(job)
    src = _prepare(
        dsn, schema, data_dir, databases, master, partitions, hook_settings(subject_of, upcasters, serializers)
    )
    source, sp = src.jdbc, src.settings.spark

    async def go() -> Any:
        async with src.journal(entity_type) as j:
            payloads = await _payloads(j, source)
            spark = spark_session(sp)
            return await backfill(
                spark, j, source, name, entity_type, fn, table=table, key=tuple(key or ()),
                partitions=sp.partitions, fetch_size=sp.fetch_size, batch_size=sp.batch_size,
                placed=await _placed(j, src.settings), payloads=payloads,
            )  # fmt: skip

    with _worker_errors():
        r = asyncio.run(go())
    _say(
        f"backfill {r.name}: {r.events} events read in {r.partitions} partitions, {r.rows_written} rows "
        f"written to {r.table}, offsets at {r.cutoff.isoformat()}, {r.seconds:.1f} s"
    )
    _say(f"continue with: projections run {r.name} --entity-type {entity_type} --handler <module:handler>")


def spark_export(
    entity_type: EntityTypeOption,
    out: Annotated[Path, typer.Option("--out", help="Output directory (Parquet).")],
    by: Annotated[str, typer.Option("--by", help="Partition the files by slice_range or date.")] = "slice_range",
    decode: Annotated[bool, typer.Option("--decode/--raw", help="Decode JSON payloads into columns.")] = True,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing output directory.")] = False,
    partitions: PartitionsOption = None,
    master: MasterOption = None,
    dsn: DsnOption = None,
    databases: DatabasesOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
    subject_of: SubjectOfOption = None,
    upcasters: UpcastersOption = None,
    serializers: SerializersOption = None,
) -> None:
    """Write the events of an entity type to Parquet, partitioned by slice range (or date);
    decoded as the journal reads them (decrypted, upcast), a forgotten subject's with forgotten
    true and a null event."""
    from .decode import decode_events
    from .environment import spark_session
    from .export import export_parquet
    from .reader import read_journal

    src = _prepare(
        dsn, schema, data_dir, databases, master, partitions, hook_settings(subject_of, upcasters, serializers)
    )
    sp = src.settings.spark

    async def check() -> Any:
        async with src.journal(entity_type) as j:
            return await _placed(j, src.settings), (await _payloads(j, src.jdbc) if decode else None)

    placed, payloads = asyncio.run(check())
    started = time.monotonic()
    spark = spark_session(sp)
    df = read_journal(spark, placed, entity_type, partitions=sp.partitions, fetch_size=sp.fetch_size)
    with _worker_errors():
        if decode:
            df = decode_events(df, payloads=payloads)
        export_parquet(df, out, partition_by=by, partitions=sp.partitions, overwrite=overwrite)  # type: ignore[arg-type]
    rows = spark.read.parquet(str(out)).count()
    _say(
        f"exported {rows} events of {entity_type} in {sp.partitions} partitions to {out} "
        f"(by {by}), {time.monotonic() - started:.1f} s"
    )


def register(app: typer.Typer) -> None:
    """Add ``spark-backfill`` and ``spark-export`` to ``app`` (the ``projections`` command line)."""
    app.command("spark-backfill")(spark_backfill)
    app.command("spark-export")(spark_export)
