"""The ``projections`` command line: run workers, and status / pause / resume / reset / clear."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
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
    root_app,
)
from journal.cli.failures import configure_logging, run_app

from .spark import cli as spark_cli

app = root_app("projections", "Run and manage projection workers over the slice journal.")

SlicesOption = Annotated[str, typer.Option("--slices", help="Slice range LO-HI (default: all).")]

log = logging.getLogger("projections")


def _settings(schema: str | None, data_dir: Path | None, databases: str | None = None, **more: Any) -> Any:
    """The settings of every command: the environment (``JOURNAL_DATABASES`` included), then
    the options; the home database is found as the library finds it (``target_dsn``)."""
    from journal.cli.common import settings_from

    return settings_from(schema, data_dir, databases, **more)


def _range(slices: str) -> tuple[int, int]:
    from journal.errors import InvalidArgument

    lo, sep, hi = slices.partition("-")
    try:
        return int(lo), int(hi if sep else lo)
    except ValueError:
        raise InvalidArgument(f"--slices must look like LO-HI (e.g. 0-511), got {slices!r}") from None


def _from_snapshots(on: bool, hook: str | None, mode: str, *, plain: bool) -> dict[str, Any]:
    """The worker's options of ``--from-snapshots`` and ``--snapshot-handler``, checked
    (``plain``: an entity type's events to a handler, not a tag's or to Kafka)."""
    from journal.errors import InvalidArgument

    from .handlers import load_handler

    if on and not plain:
        raise InvalidArgument(
            "--from-snapshots runs a handler over an entity type's events (not --tag, --to-kafka, --states)"
        )
    if hook is not None and not on:
        raise InvalidArgument("--snapshot-handler needs --from-snapshots")
    return {"from_snapshots": on, "snapshot_handler": load_handler(hook, mode) if hook is not None else None}


@app.command()
def run(
    name: Annotated[str, typer.Argument(help="Projection name (offsets and leases are kept under it).")],
    handler: Annotated[str | None, typer.Option("--handler", help="The handler, as package.module:callable.")] = None,
    mode: Annotated[str, typer.Option("--mode", help="exactly-once | grouped | at-least-once")] = "grouped",
    workers: Annotated[int, typer.Option("--workers", min=1, help="Workers in this process.")] = 1,
    to_kafka: Annotated[
        str | None, typer.Option("--to-kafka", help="Publish each event to this Kafka topic instead (docs/kafka.md).")
    ] = None,
    kafka_bootstrap: Annotated[
        str, typer.Option("--kafka-bootstrap", envvar="KAFKA_BOOTSTRAP_SERVERS", help="Kafka brokers, host:port,...")
    ] = "localhost:9092",
    kafka_at_least_once: Annotated[
        bool, typer.Option("--kafka-at-least-once", help="With --to-kafka: at least once, without transactions.")
    ] = False,
    kafka_config: Annotated[
        Path | None,
        typer.Option(
            "--kafka-config",
            envvar="KAFKA_CONFIG_FILE",
            help="With --to-kafka: librdkafka client settings, key=value lines (a login: docs/kafka.md).",
        ),
    ] = None,
    entity_type: Annotated[
        str | None, typer.Option("--entity-type", help="Entity type whose events are projected (slices).")
    ] = None,
    tag: Annotated[str | None, typer.Option("--tag", help="Project the events of this tag instead.")] = None,
    states: Annotated[
        bool, typer.Option("--states", help="With --entity-type: project its durable states' changes, not its events.")
    ] = False,
    dsn: DsnOption = None,
    databases: DatabasesOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress", help="Live display.")] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option("--metrics-port", min=0, help="Serve Prometheus metrics on this port (0: a free one)."),
    ] = None,
    metrics_addr: Annotated[str, typer.Option("--metrics-addr", help="Address of the metrics server.")] = "127.0.0.1",
    metrics_interval: Annotated[
        float, typer.Option("--metrics-interval", min=0.1, help="Seconds between lag samples.")
    ] = 5.0,
    on_failure: Annotated[
        str | None,
        typer.Option(
            "--on-failure",
            help="retry-and-dead-letter-sequenced (an id's later events wait behind its dead letter) | "
            "retry-and-dead-letter | retry-and-skip | retry-and-fail | fail, optionally :ATTEMPTS "
            "(default: projection.handler_recovery).",
        ),
    ] = None,
    subject_of: SubjectOfOption = None,
    upcasters: UpcastersOption = None,
    serializers: SerializersOption = None,
    version: Annotated[
        int | None,
        typer.Option("--version", min=1, help="Run version N: offsets under NAME@N, tables in its own schema."),
    ] = None,
    from_snapshots: Annotated[
        bool,
        typer.Option(
            "--from-snapshots",
            help="Start each range from its ids' latest snapshots, then their later events (docs/projections.md).",
        ),
    ] = False,
    snapshot_handler: Annotated[
        str | None,
        typer.Option(
            "--snapshot-handler",
            help="With --from-snapshots: package.module:callable turning a snapshot into read-model state.",
        ),
    ] = None,
) -> None:
    """Run projection workers until SIGTERM/SIGINT (then commit or roll back, release leases)."""
    from journal import runtime
    from journal.errors import DestinationRefused, InvalidArgument
    from journal.ids import validate_entity_type, validate_name, validate_tags
    from journal.journal import open_journal

    from .entity_types import has_events, known_entity_types, listing
    from .handlers import load_handler
    from .recovery import HandlerRecovery
    from .state_runner import StateWorker, refuse_sequenced
    from .tag_runner import TagWorker
    from .version_run import ProjectionVersioning
    from .versions import register_on
    from .worker import Worker

    # everything a person typed is checked before anything connects or starts
    if (entity_type is None) == (tag is None):
        raise InvalidArgument("give exactly one of --entity-type and --tag")
    if states and (entity_type is None or to_kafka is not None):
        raise InvalidArgument("--states projects an entity type's durable states (with --entity-type and --handler)")
    validate_name(name, "projection name")
    if entity_type is not None:
        validate_entity_type(entity_type, required=True)
    else:
        validate_tags([tag])
    settings = _settings(
        schema, data_dir, databases, **hook_settings(subject_of, upcasters, serializers), **_kafka_batch(to_kafka)
    )
    hooks = journal_hooks(settings)
    if version is not None and (tag is not None or to_kafka is not None or states):
        raise InvalidArgument("--version runs a handler over an entity type's events (not --tag, --to-kafka, --states)")
    ProjectionVersioning.of(settings.schema, name, version, mode)  # checked before anything connects
    if (handler is None) == (to_kafka is None):
        raise InvalidArgument("give exactly one of --handler and --to-kafka")
    plain = tag is None and to_kafka is None and not states
    snapshots = _from_snapshots(from_snapshots, snapshot_handler, mode, plain=plain)
    publisher = (
        _kafka_publisher(to_kafka, kafka_bootstrap, kafka_at_least_once, mode, tag, kafka_config) if to_kafka else None
    )
    fn = publisher if publisher is not None else load_handler(handler or "", mode)
    recovery = HandlerRecovery.parse(on_failure, settings.projection)
    if states:
        refuse_sequenced(recovery)
    show = sys.stdout.isatty() if progress is None else progress
    for logger in ("projections", "journal"):  # INFO for our own loggers, not for the libraries below
        logging.getLogger(logger).setLevel(logging.INFO)
    port = None
    if metrics_port is not None:  # bound first: a port in use fails before anything connects
        from . import metrics

        port = metrics.serve(metrics_port, metrics_addr)
        log.info("metrics on http://%s:%d/metrics", metrics_addr, port)

    async def go() -> int:
        if publisher is not None:
            await _check_kafka(publisher, name)
        async with open_journal(dsn, settings=settings, **hooks) as j:
            if entity_type is not None and not states and not await has_events(j, entity_type):
                log.warning(
                    "entity type %r has no events yet (waiting for some); the journal has %s",
                    entity_type, listing(await known_entity_types(j)),
                )  # fmt: skip
            if version is not None:  # a retired version or another entity type: one line, exit 2
                await register_on(j, name, version, entity_type or "")
            et = entity_type or ""
            options: dict[str, Any] = {"recovery": recovery}
            if tag is None and not states:
                options.update(version=version, **snapshots)
            ws: list[Worker] = [
                TagWorker(j, j.settings, name, tag, fn, mode, **options)
                if tag is not None
                else StateWorker(j, j.settings, name, et, fn, mode, **options)
                if states
                else Worker(j, j.settings, name, et, fn, mode, **options)
                for _ in range(workers)
            ]
            loop = asyncio.get_running_loop()

            def stop_all() -> None:
                for w in ws:
                    w.stop()

            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop_all)

            def dump_tasks() -> None:  # diagnostics: kill -USR1 <pid> prints every task's stack
                for t in asyncio.all_tasks():
                    t.print_stack(file=sys.stderr)

            loop.add_signal_handler(signal.SIGUSR1, dump_tasks)
            tasks = [asyncio.create_task(w.run()) for w in ws]
            reporter = asyncio.create_task(_report(ws, show))
            sampler = None
            if port is not None and any(w.lag_by_slice for w in ws):  # a tag projection's lag is not by slice
                from . import metrics

                sampler = metrics.LagSampler(
                    ws, j.backend.shared_connections().pool, j.settings.schema, interval=metrics_interval
                )
                sampler_task = asyncio.create_task(sampler.run())
            results = await asyncio.gather(*tasks, return_exceptions=True)
            reporter.cancel()
            if publisher is not None:
                await publisher.close()
            if sampler is not None:
                sampler.stop()
                await sampler_task
            failed = [r for r in results if isinstance(r, BaseException)]
            refused = [r for r in failed if isinstance(r, DestinationRefused)]
            if refused:  # a login or an ACL refused: one line, exit 2 (as at the start)
                raise refused[0]
            for r in failed:
                log.error("worker stopped: %s", r)
            return 1 if failed else 0

    raise typer.Exit(runtime.run(go()))  # on uvloop when installed: ~6% less CPU per projected event


async def _check_kafka(publisher: Any, name: str) -> None:
    """A missing topic: one line before anything starts. Brokers that do not answer: one warning,
    then the workers start and wait for them (an outage, shown by ``projections status``)."""
    from journal.errors import DestinationUnavailable

    try:
        await publisher.check(name)
    except DestinationUnavailable as e:
        log.warning("%s; the workers start and wait for it (projections status shows it)", e)


def _kafka_batch(to_kafka: str | None) -> dict[str, Any]:
    """``--to-kafka``: batches of :data:`.kafka.GROUP_SIZE` events unless the environment sets
    ``projection.group_size``."""
    from journal.settings import set_in_env

    from .kafka import GROUP_SIZE

    if to_kafka is None or set_in_env("projection.group_size"):
        return {}
    return {"group_size": GROUP_SIZE}


def _kafka_publisher(
    topic: str, bootstrap: str, at_least_once: bool, mode: str, tag: str | None, config: Path | None
) -> Any:
    """``--to-kafka``: the publisher handler (grouped mode, entity types only); ``config``: a file
    of librdkafka settings (:mod:`.kafka.settings_file`)."""
    from journal.errors import ConfigurationError, InvalidArgument

    if tag is not None or mode != "grouped":
        raise InvalidArgument("--to-kafka publishes an entity type's events in grouped mode (no --tag, no --mode)")
    try:
        from .kafka.publisher import KafkaPublisher
    except ImportError as e:
        raise ConfigurationError(f"--to-kafka needs the kafka extra: pip install 'slice-journal[kafka]' ({e})") from e
    from .kafka.settings_file import read_settings

    settings = read_settings(config) if config is not None else None
    return KafkaPublisher(bootstrap, topic, exactly_once=not at_least_once, config=settings)


async def _report(ws: list[Any], show: bool) -> None:
    """Events/s and lag: a rich live line on a terminal; otherwise a log line every 10 s in which
    events were processed (an idle worker stays quiet)."""
    last_n, last_t = 0, time.monotonic()

    def line() -> str:
        nonlocal last_n, last_t
        n = sum(w.stats.events for w in ws)
        now = time.monotonic()
        rate = (n - last_n) / max(now - last_t, 1e-6)
        last_n, last_t = n, now
        lag = max((w.stats.lag_seconds for w in ws), default=0.0)
        ranges = ", ".join(f"{lo}-{hi}" for w in ws for lo, hi in w.owned) or "none yet"
        return f"{n} events, {rate:,.0f} events/s, lag {lag:.2f}s, slices {ranges}"

    if show:
        from rich.live import Live

        with Live("starting...", refresh_per_second=4, transient=False) as live:
            while True:
                await asyncio.sleep(1.0)
                live.update(line())
    else:
        while True:
            await asyncio.sleep(10.0)
            if sum(w.stats.events for w in ws) != last_n:
                log.info("%s", line())


def _with_conn(
    dsn: str | None, schema: str | None, data_dir: Path | None, fn: Any, what: str, databases: str | None = None
) -> Any:
    """``fn(conn, sql)`` on a connection of its own to the home database (where offsets, leases
    and dead letters are); failures come out as the library's errors."""
    from journal.cli.common import target_dsn
    from journal.postgres import connect, mapped_errors, target_of

    from .postgres_store import ProjectionSql

    settings = _settings(schema, data_dir, databases)
    target, _ = target_dsn(dsn, settings)

    async def go() -> Any:
        conn = await connect(target, settings)
        try:
            with mapped_errors(what, target_of(target)):
                return await fn(conn, ProjectionSql(settings.schema))
        finally:
            await conn.close()

    return asyncio.run(go())


def _journal_databases(
    dsn: str | None, schema: str | None, data_dir: Path | None, databases: str | None
) -> list[tuple[int, int, str]]:
    """The journal's ``(min_slice, max_slice, database)`` runs when it has several databases
    (``JOURNAL_DATABASES``), from their partition map; else none."""
    from journal.backends import open_partitioned
    from journal.cli.common import target_dsn

    settings = _settings(schema, data_dir, databases)
    if not settings.partitions.databases:
        return []
    home, _ = target_dsn(dsn, settings)

    async def go() -> list[tuple[int, int, str]]:
        backend = await open_partitioned(home, settings)
        try:
            return backend.dbs.map.describe(backend.dbs.names)
        finally:
            await backend.close()

    return asyncio.run(go())


@app.command()
def status(
    name: Annotated[str | None, typer.Argument(help="Projection (default: all).")] = None,
    dsn: DsnOption = None,
    databases: DatabasesOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (for scripts and monitoring).")] = False,
) -> None:
    """Per projection and slice range: offset, lag, owner, paused; workers and their errors."""
    from rich.console import Console
    from rich.table import Table

    from . import management
    from .dead_letter_store import DeadLetterSql
    from .parked_store import ParkedSql
    from .versions import by_versioned_name, status_names

    served = _journal_databases(dsn, schema, data_dir, databases)

    async def go(conn: Any, sql: Any) -> tuple[list[Any], dict[str, Any]]:
        names, versions = await status_names(conn, sql, name)
        dead, parked = DeadLetterSql(sql.schema), ParkedSql(sql.schema)
        statuses = [await management.status(conn, sql, n, dead, served, parked) for n in names]
        return statuses, by_versioned_name(versions)

    results, versions = _with_conn(dsn, schema, data_dir, go, "projections status", databases)
    if as_json:
        typer.echo(management.status_json(results, versions))
        return
    console = Console()
    if not results:
        console.print("no projections")
    for st in results:
        t = Table(title=f"projection {st.name}")
        for c in ("slices", "owner", "offset", "lag", "paused", *(("database",) if served else ())):
            t.add_column(c)
        for r in st.ranges:
            t.add_row(
                f"{r.lo}-{r.hi}", r.owner or "-", r.offset.isoformat() if r.offset else "-",
                f"{r.lag_seconds:.1f}s" if r.lag_seconds is not None else "-", "yes" if r.paused else "",
                *((r.database or "-",) if served else ()),
            )  # fmt: skip
        console.print(t)
        w = Table(title=f"workers of {st.name}")
        for c in ("worker", "state", "live", "events", "error"):
            w.add_column(c)
        for row in st.workers:
            state = "dead (lease expired)" if row["state"] == "running" and not row["live"] else row["state"]
            w.add_row(row["worker_id"], state, str(row["live"]), str(row["events"]), row["error"] or "")
        console.print(w)
        _dead_letters_line(st)
        if v := versions.get(st.name):  # one line, not wrapped: scripts grep it
            typer.echo(
                f"{st.name}: version {v['version']} of {v['name']}, {v['state']}, tables in schema {v['tables_schema']}"
            )


def _dead_letters_line(st: Any) -> None:
    """``projections status``: the dead letters of a projection and the events parked behind them."""
    if st.dead_letters or st.parked:
        parked = f", {st.parked} events parked behind them" if st.parked else ""
        typer.echo(f"{st.dead_letters} dead letters{parked} (projections dead-letters list {st.name})")


def _pausing(paused: bool, summary: str) -> Callable[..., None]:
    """``pause`` (``paused``) or ``resume``: the same options, ``summary`` its help."""
    what = "pause" if paused else "resume"

    def command(
        name: str, slices: SlicesOption = "0-1023", dsn: DsnOption = None, schema: SchemaOption = None,
        data_dir: DataDirOption = None, databases: DatabasesOption = None,
    ) -> None:  # fmt: skip
        from . import management

        lo, hi = _range(slices)
        _with_conn(
            dsn, schema, data_dir, lambda c, s: management.set_paused(c, s, name, lo, hi, paused), what, databases
        )
        typer.echo(f"{what}d {name} slices {lo}-{hi}")

    command.__doc__ = summary
    return command


app.command("pause")(
    _pausing(True, "Pause a projection (or a slice range): workers commit their batch and stop processing it.")
)
app.command("resume")(_pausing(False, "Resume a paused projection (or slice range): workers reload offsets and go on."))


@app.command()
def reset(
    name: str,
    to: Annotated[datetime, typer.Option("--to", help="Restart at this timestamp (ISO 8601; UTC if naive).")],
    slices: SlicesOption = "0-1023", dsn: DsnOption = None, schema: SchemaOption = None,
    data_dir: DataDirOption = None, databases: DatabasesOption = None,
) -> None:  # fmt: skip
    """Set the offset of a (paused) projection: events before --to count as done."""
    from . import management

    lo, hi = _range(slices)
    _with_conn(dsn, schema, data_dir, lambda c, s: management.reset(c, s, name, lo, hi, to), "reset", databases)
    typer.echo(f"reset {name} slices {lo}-{hi} to {to.isoformat()}")


@app.command()
def clear(
    name: str, slices: SlicesOption = "0-1023", dsn: DsnOption = None, schema: SchemaOption = None,
    data_dir: DataDirOption = None, databases: DatabasesOption = None,
) -> None:  # fmt: skip
    """Forget the offsets of a (paused) projection: it starts again from the first event."""
    from . import management

    lo, hi = _range(slices)
    n = _with_conn(dsn, schema, data_dir, lambda c, s: management.clear(c, s, name, lo, hi), "clear", databases)
    typer.echo(f"cleared {n} offset rows of {name} slices {lo}-{hi}")


@app.command()
def switch(
    name: Annotated[str, typer.Argument(help="The projection (as run with --version).")],
    version: Annotated[int, typer.Argument(help="The version readers are to see.")],
    wait: Annotated[
        float, typer.Option("--wait", min=0, help="Seconds to wait for the version to catch up with the serving one.")
    ] = 5.0,
    dsn: DsnOption = None, schema: SchemaOption = None, data_dir: DataDirOption = None,
    databases: DatabasesOption = None,
) -> None:  # fmt: skip
    """Make version VERSION of NAME the one readers see (its views), atomically; the old one's workers stop."""
    from .versions import switch as switch_to

    done = _with_conn(dsn, schema, data_dir, lambda c, s: switch_to(c, _versions(s), name, version, wait), "switch",
                      databases)  # fmt: skip
    if done.done_before:
        typer.echo(f"version {version} of {name} already serves")
        return
    before = f"version {done.previous}" if done.previous is not None else "no version"
    typer.echo(f"version {version} of {name} serves ({before} before): views {', '.join(done.views)}")


@app.command("drop-version")
def drop_version(
    name: Annotated[str, typer.Argument(help="The projection (as run with --version).")],
    version: Annotated[int, typer.Argument(help="The version to drop (not the serving one).")],
    dsn: DsnOption = None, schema: SchemaOption = None, data_dir: DataDirOption = None,
    databases: DatabasesOption = None,
) -> None:  # fmt: skip
    """Drop a version that does not serve: its schema and tables, offsets, leases and rows."""
    from .versions import drop

    v = _with_conn(dsn, schema, data_dir, lambda c, s: drop(c, _versions(s), name, version), "drop-version", databases)
    typer.echo(f"dropped version {version} of {name} (schema {v.tables_schema}, offsets of {v.versioned_name})")


def _versions(sql: Any) -> Any:
    from .version_store import VersionSql

    return VersionSql(sql.schema)


@app.command()
def wait(
    name: Annotated[str, typer.Argument(help="The projection that must have processed the write.")],
    pid: Annotated[str, typer.Option("--pid", help="Persistence id of the write.")],
    seq_nr: Annotated[int, typer.Option("--seq-nr", min=1, help="The write's (highest) sequence number.")],
    timeout: Annotated[float, typer.Option("--timeout", min=0, help="Give up after this many seconds.")] = 10.0,
    dsn: DsnOption = None, schema: SchemaOption = None, data_dir: DataDirOption = None,
    databases: DatabasesOption = None,
) -> None:  # fmt: skip
    """Wait until projection NAME has processed event --seq-nr of --pid (exit 1 at --timeout)."""
    from journal.cli.common import target_dsn
    from journal.errors import ProjectionError
    from journal.offsets import TimestampOffset
    from journal.postgres import mapped_errors, target_of

    from .write_waits import wait_processed

    settings = _settings(schema, data_dir, databases)
    target, _ = target_dsn(dsn, settings)
    written = TimestampOffset(datetime.now(UTC), {pid: seq_nr})

    async def go() -> bool:
        with mapped_errors("projections wait", target_of(target)):
            return await wait_processed(settings.with_dsn(target), name, written, timeout)

    started = time.monotonic()
    if not asyncio.run(go()):
        raise ProjectionError(f"projection {name!r} has not processed {pid} #{seq_nr} within {timeout:g} s")
    typer.echo(f"{name} has processed {pid} #{seq_nr} ({(time.monotonic() - started) * 1000:.1f} ms)")


dead_letters_app = typer.Typer(
    name="dead-letters", help="Events a projection's handler kept failing on.", no_args_is_help=True
)
app.add_typer(dead_letters_app)
PidOption = Annotated[str | None, typer.Option("--pid", help="Only the dead letters of this persistence id.")]
SeqNrOption = Annotated[int | None, typer.Option("--seq-nr", min=1, help="Only this event (with --pid).")]


@dead_letters_app.command("list")
def dead_letters_list(
    name: str, dsn: DsnOption = None, schema: SchemaOption = None, data_dir: DataDirOption = None,
    databases: DatabasesOption = None, subject_of: SubjectOfOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON, with the tracebacks.")] = False,
) -> None:  # fmt: skip
    """List a projection's dead letters, in the order a retry applies them, with the number of
    events parked behind each (retry-and-dead-letter-sequenced)."""
    from .dead_letter_store import DeadLetterSql
    from .dead_letters import letters_json
    from .parked_store import ParkedSql

    async def go(conn: Any, sql: Any) -> tuple[list[Any], dict[tuple[str, int], int]]:
        return await DeadLetterSql(sql.schema).letters(conn, name), await ParkedSql(sql.schema).behind(conn, name)

    letters, behind = _with_conn(dsn, schema, data_dir, go, "dead-letters", databases)
    letters = _opened(letters, dsn, schema, data_dir, databases, subject_of)
    if as_json:
        typer.echo(letters_json(letters, behind))
        return
    for d in letters:
        n = behind.get((d.persistence_id, d.seq_nr), 0)
        typer.echo(
            f"{d.persistence_id} #{d.seq_nr}  slice {d.slice}  {d.attempts} attempts  "
            f"last {d.last_failure.isoformat()}  {f'{n} parked behind  ' if n else ''}{d.error}"
        )
    for (pid, ahead), n in sorted(behind.items()):
        if ahead == 0:  # no dead letter leads them: a drain stopped half-way
            typer.echo(f"{pid}: {n} parked with no dead letter ahead (a drain stopped half-way: retry finishes it)")
    parked = sum(behind.values())
    typer.echo(f"{len(letters)} dead letters of {name}" + (f", {parked} events parked behind them" if parked else ""))


def _opened(
    letters: list[Any],
    dsn: str | None,
    schema: str | None,
    data_dir: Path | None,
    databases: str | None,
    subject_of: str | None,
) -> list[Any]:
    """Dead letters sealed with their subjects' keys (an encrypting journal's), opened: the
    subjects are the writers' (``--subject-of`` or ``$JOURNAL_SUBJECT_OF``)."""
    from journal.cli.common import target_dsn
    from journal.journal import open_journal
    from journal.sealed_text import is_sealed

    from .dead_letter_store import opened

    if not any(is_sealed(d.error) or is_sealed(d.traceback) for d in letters):
        return letters
    settings = _settings(schema, data_dir, databases, **hook_settings(subject_of, None, None))
    hooks = journal_hooks(settings)
    target, _ = target_dsn(dsn, settings)

    async def go() -> list[Any]:
        async with open_journal(target, settings=settings, **hooks) as j:
            return await opened(j.serializers, letters)

    return asyncio.run(go())


@dead_letters_app.command("retry")
def dead_letters_retry(
    name: str,
    handler: Annotated[str, typer.Option("--handler", help="The (fixed) handler, as package.module:callable.")],
    mode: Annotated[str, typer.Option("--mode", help="exactly-once | grouped | at-least-once")] = "grouped",
    pid: PidOption = None, seq_nr: SeqNrOption = None, dsn: DsnOption = None, schema: SchemaOption = None,
    data_dir: DataDirOption = None, databases: DatabasesOption = None, subject_of: SubjectOfOption = None,
    upcasters: UpcastersOption = None, serializers: SerializersOption = None,
    states: Annotated[
        bool, typer.Option("--states", help="The letters of a state projection (projections run --states).")
    ] = False,
) -> None:  # fmt: skip
    """Apply the dead letters with the handler, in order, each once; exit 1 if any failed again."""
    from journal.cli.common import target_dsn
    from journal.journal import open_journal

    from .dead_letter_store import DeadLetterSql
    from .dead_letters import StateLoader, retry
    from .handlers import load_handler, validate_mode
    from .state_runner import state_handler

    fn = load_handler(handler, mode)
    kind = validate_mode(mode)
    settings = _settings(schema, data_dir, databases, **hook_settings(subject_of, upcasters, serializers))
    hooks = journal_hooks(settings)
    target, _ = target_dsn(dsn, settings)

    async def go(conn: Any, sql: Any) -> Any:
        dead = DeadLetterSql(sql.schema)
        async with open_journal(target, settings=settings, **hooks) as j:
            if not states:
                return await retry(j, conn, dead, name, fn, kind, persistence_id=pid, seq_nr=seq_nr)
            loader = StateLoader(j, dead)
            return await retry(
                loader, conn, dead, name, state_handler(fn, kind), kind, persistence_id=pid, seq_nr=seq_nr,
                still_current=loader.still_current,
            )  # fmt: skip

    result = _with_conn(target, schema, data_dir, go, "dead-letters retry", databases)
    _print_retry(result, name, states)
    raise typer.Exit(1 if result.failed or result.missing else 0)


def _print_retry(result: Any, name: str, states: bool) -> None:
    for letter, error in result.failed:
        typer.echo(f"failed again: {letter.persistence_id} #{letter.seq_nr}: {error}", err=True)
    for letter in result.missing:
        where = "in the durable state store" if states else "in the journal"
        typer.echo(f"not {where} any more: {letter.persistence_id} #{letter.seq_nr}", err=True)
    for letter, revision in result.superseded:
        typer.echo(
            f"superseded: {letter.persistence_id} #{letter.seq_nr} (at revision {revision} now, which the "
            "projection delivers as any change): taken, not applied"
        )
    _drained(result, name)
    superseded = f", superseded {len(result.superseded)}" if states else ""
    typer.echo(
        f"applied {len(result.applied)}, failed {len(result.failed)}, waiting {len(result.waiting)}, "
        f"missing {len(result.missing)}{superseded} dead letters of {name}"
    )


def _drained(result: Any, name: str) -> None:
    """The parked events a retry or discard applied (and dropped) behind the dead letters."""
    for pid, seq_nr in result.dropped:
        typer.echo(f"parked event not in the journal any more, dropped: {pid} #{seq_nr}", err=True)
    if result.drained or result.dropped:
        typer.echo(f"drained {len(result.drained)} parked events of {name} in order")


@dead_letters_app.command("discard")
def dead_letters_discard(
    name: str, pid: PidOption = None, seq_nr: SeqNrOption = None,
    everything: Annotated[bool, typer.Option("--all", help="Discard every dead letter of the projection.")] = False,
    handler: Annotated[
        str | None,
        typer.Option("--handler", help="Then apply the events parked behind them, in order, with this handler."),
    ] = None,
    mode: Annotated[str, typer.Option("--mode", help="exactly-once | grouped | at-least-once")] = "grouped",
    dsn: DsnOption = None, schema: SchemaOption = None, data_dir: DataDirOption = None,
    databases: DatabasesOption = None, subject_of: SubjectOfOption = None, upcasters: UpcastersOption = None,
    serializers: SerializersOption = None,
) -> None:  # fmt: skip
    """Delete dead letters without applying them (--pid [--seq-nr], or --all); with --handler, the
    events parked behind them are then applied in order. Exit 1 if one of those failed."""
    from journal.cli.common import target_dsn
    from journal.errors import InvalidArgument
    from journal.journal import open_journal

    from .dead_letter_store import DeadLetterSql
    from .dead_letters import discard
    from .handlers import load_handler, validate_mode

    if (pid is None) == (not everything) or (seq_nr is not None and pid is None):
        raise InvalidArgument("give --pid (and optionally --seq-nr), or --all")
    kind = validate_mode(mode)
    fn = load_handler(handler, mode) if handler is not None else None
    settings = _settings(schema, data_dir, databases, **hook_settings(subject_of, upcasters, serializers))
    target, _ = target_dsn(dsn, settings)

    async def go(conn: Any, sql: Any) -> Any:
        dead = DeadLetterSql(sql.schema)
        if fn is None:
            return await discard(conn, dead, name, pid, seq_nr)
        async with open_journal(target, settings=settings, **journal_hooks(settings)) as j:
            return await discard(conn, dead, name, pid, seq_nr, j, fn, kind)

    n, result = _with_conn(target, schema, data_dir, go, "discard", databases)
    for letter, error in result.failed:
        typer.echo(
            f"parked event failed, now the dead letter: {letter.persistence_id} #{letter.seq_nr}: {error}", err=True
        )
    _drained(result, name)
    typer.echo(f"discarded {n} dead letters of {name}")
    raise typer.Exit(1 if result.failed else 0)


spark_cli.register(app)


def main() -> None:
    """Console script entry point (also ``python -m projections``): one line per failure."""
    configure_logging("%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_app(app, "projections")
