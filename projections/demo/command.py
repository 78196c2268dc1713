"""``journal demo``: carts written concurrently, projected by worker processes that are killed,
restarted and rescaled mid-run; then the read model is verified against a journal replay.

:func:`register` adds the command to the ``journal`` app; it is found through the
``slice_journal.cli`` entry-point group (see :mod:`journal.cli`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from journal.cli.common import DataDirOption, DsnOption, SchemaOption, check_reachable, settings_from, target_dsn
from journal.waits import within


def register(app: typer.Typer) -> None:
    """Add ``demo`` to ``app`` (the ``journal`` command line)."""
    app.command("demo")(demo)


def demo(
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
    entities: Annotated[int, typer.Option(min=1, help="Shopping carts writing concurrently.")] = 2000,
    duration: Annotated[float, typer.Option(min=5, help="Seconds of write load.")] = 40.0,
    workers: Annotated[int, typer.Option(min=1, help="Projection worker processes at the start.")] = 2,
    scale_to: Annotated[int, typer.Option(min=1, help="Worker processes after the rescale.")] = 4,
    rate: Annotated[float, typer.Option(min=10, help="Target events written per second.")] = 1000.0,
    writers: Annotated[int, typer.Option(min=1, help="Concurrent writer tasks.")] = 50,
    databases: Annotated[
        int,
        typer.Option(
            min=1, help="Journal databases (a divisor of 1024) on the same server, the slices split over them."
        ),
    ] = 1,
) -> None:
    """Write, project across processes (kill one, restart, rescale), verify: exit 1 on any loss or double."""
    from journal.postgres import schema_migrations

    settings = settings_from(schema, data_dir)
    target, embedded = target_dsn(dsn, settings)
    typer.echo(f"database: {'embedded PostgreSQL ' + str(settings.connection.data_dir) if embedded else 'DSN'}")
    check_reachable(target, settings)
    migrations = schema_migrations()
    home = target
    if databases > 1:
        # the demo's own databases, the first its home: the server's journal is never touched
        parts = asyncio.run(_partition_databases(target, settings, databases))
        for d in parts:
            migrations.upgrade(d, settings.schema)
        settings = settings_from(schema, data_dir, " ".join(parts))
        home = parts[0]
        typer.echo(f"journal databases: {databases} of its own on the same server, {1024 // databases} slices each")
    else:
        migrations.upgrade(target, settings.schema)
    ok = asyncio.run(_demo(home, settings.with_dsn(home), entities, duration, workers, scale_to, rate, writers))
    raise typer.Exit(0 if ok else 1)


async def _partition_databases(server: str, settings: Any, n: int) -> tuple[str, ...]:
    """The demo's ``n`` databases on the server of ``server`` (``<database>_d<n>_p0``.., one set
    per count, created when missing); the first is the demo journal's home (the read model and
    the projection offsets). The database of ``server`` itself is not changed."""
    from urllib.parse import urlsplit, urlunsplit

    from journal.errors import ConfigurationError
    from journal.postgres import connect
    from journal.settings import validate_identifier

    from . import statements

    if 1024 % n:
        raise ConfigurationError(f"--databases must divide 1024, got {n}")
    parts = urlsplit(server)
    conn = await connect(server, settings)
    try:
        base = parts.path.lstrip("/") or str(await conn.fetchval(statements.CURRENT_DATABASE))
        names = [validate_identifier(f"{base}_d{n}_p{i}", "database") for i in range(n)]
        for name in names:
            if not await conn.fetchval(statements.DATABASE_EXISTS, name):
                await conn.execute(statements.create_database(name))
    finally:
        await conn.close()
    return tuple(urlunsplit(parts._replace(path="/" + name)) for name in names)


async def _demo(
    dsn: str, settings: Any, entities: int, duration: float, n_workers: int, scale_to: int, rate: float,
    writers: int,
) -> bool:  # fmt: skip
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from journal.journal import open_journal
    from journal.postgres import connect

    from . import statements
    from .cart import CartWorkload, prepare, projected_count, verify
    from .report import latency_rows, pace

    console = Console()
    run_id = uuid.uuid4().hex[:8]
    entity_type = f"DemoCart{run_id}"
    name = f"demo-carts-{run_id}"
    logdir = Path(tempfile.mkdtemp(prefix="journal-demo-"))
    env = {
        **os.environ,
        "JOURNAL_PROJECTION_LEASE_TTL": "3",
        "JOURNAL_PROJECTION_LEASE_RENEW_INTERVAL": "0.5",
        "JOURNAL_PROJECTION_HEARTBEAT_OFFSET_INTERVAL": "2",
        "JOURNAL_SCHEMA": settings.schema,
        "JOURNAL_DATABASES": " ".join(settings.partitions.databases),
    }
    procs: list[asyncio.subprocess.Process] = []
    started = 0

    async def spawn() -> asyncio.subprocess.Process:
        nonlocal started
        started += 1
        log = open(logdir / f"worker-{started}.log", "wb")  # noqa: ASYNC230
        p = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "projections", "run", name, "--entity-type", entity_type,
            "--handler", "projections.demo.cart:project_carts", "--mode", "grouped",
            "--dsn", dsn, "--no-progress", stdout=log, stderr=log, env=env,
        )  # fmt: skip
        procs.append(p)
        return p

    conn = await connect(dsn, settings)
    await prepare(conn)
    events: list[str] = []
    killed_at: datetime | None = None
    t0 = time.monotonic()
    async with open_journal(dsn, settings=settings) as j:
        workload = CartWorkload(j, entity_type, entities, writers, rate)
        for _ in range(n_workers):
            await spawn()
        events.append(f"{0.0:5.1f}s started {n_workers} worker processes")
        load = asyncio.create_task(workload.run())

        one_at_a_time = asyncio.Lock()  # the progress loop and the script share the connection

        async def projected() -> int:
            async with one_at_a_time:
                return await projected_count(conn, entity_type)

        async def script() -> None:
            await asyncio.sleep(duration * 0.3)
            victim = procs[0]
            nonlocal killed_at
            async with one_at_a_time:
                killed_at = await conn.fetchval(statements.NOW)
            victim.send_signal(signal.SIGKILL)
            await victim.wait()
            events.append(f"{time.monotonic() - t0:5.1f}s SIGKILL worker pid {victim.pid} (mid-batch, no goodbye)")
            await asyncio.sleep(2.0)
            p = await spawn()
            events.append(f"{time.monotonic() - t0:5.1f}s restarted it as pid {p.pid}")
            await asyncio.sleep(max(0.0, duration * 0.6 - (time.monotonic() - t0)))
            live = [p for p in procs if p.returncode is None]
            for _ in range(max(0, scale_to - len(live))):
                await spawn()
            for p in live[scale_to:]:
                p.send_signal(signal.SIGTERM)
            events.append(f"{time.monotonic() - t0:5.1f}s rescaled {len(live)} -> {scale_to} workers (live)")

        with Progress(
            TextColumn("[bold]{task.description:<10}"), BarColumn(), TextColumn("{task.completed:>8.0f}"),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console,
        ) as progress:  # fmt: skip
            w_task = progress.add_task("written", total=rate * duration, info="")
            p_task = progress.add_task("projected", total=rate * duration, info="")
            scripted = asyncio.create_task(script())
            last_p, last_t = 0, time.monotonic()
            while time.monotonic() - t0 < duration:
                await asyncio.sleep(0.5)
                n, now = await projected(), time.monotonic()
                rate_p = (n - last_p) / (now - last_t)
                last_p, last_t = n, now
                live = sum(1 for p in procs if p.returncode is None)
                progress.update(w_task, completed=workload.written, info=f"{workload.written / (now - t0):7.0f}/s")
                progress.update(
                    p_task, completed=n, info=f"{rate_p:7.0f}/s  backlog {workload.written - n:6d}  workers {live}"
                )
            workload.stop()
            await load
            await scripted
            written = workload.written
            progress.update(w_task, completed=written, total=written)
            progress.update(p_task, total=written)
            t_write_end = time.monotonic()
            deadline = t_write_end + 90
            n = await projected()
            backlog_at_end = written - n
            while n < written and time.monotonic() < deadline:
                await asyncio.sleep(0.25)
                n = await projected()
                progress.update(p_task, completed=n, info=f"catching up, backlog {written - n}")
            catch_up = time.monotonic() - t_write_end
        elapsed = time.monotonic() - t0
        for p in procs:
            if p.returncode is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                await within(p.wait(), 20)
            except TimeoutError:
                p.kill()
        v = await verify(j, conn, entity_type)
        info = await j.backend.info()
        latencies = await conn.fetch(statements.LATENCIES_SPLIT, entity_type, killed_at or datetime.now(UTC))
    await conn.close()
    for e in events:
        console.print(f"  {e}")
    ok = v.ok and v.written == workload.written
    rows = [
        ("events written", f"{v.written} ({workload.long_transactions} in long transactions, "
                           f"{workload.conflicts} rejected as conflicts)"),
        ("events projected", f"{v.distinct_projected}"),
        ("duplicates", f"{v.duplicates}"),
        ("missing", f"{v.missing}"),
        ("read model rows wrong", f"{v.view_mismatches} of {entities} carts"),
        ("projection throughput", f"{v.distinct_projected / elapsed:,.0f} events/s over {elapsed:.1f}s, "
                                  + pace(backlog_at_end, rate, catch_up)),
        *latency_rows(latencies),
        ("worker processes", f"{started} started ({n_workers} -> kill+restart -> {scale_to}); logs in {logdir}"),
        *(
            (f"database {i}", f"slices {', '.join(d['slices'])}: {d['events'].get(entity_type, 0)} events")
            for i, d in enumerate(info.get("databases", []))
        ),
    ]  # fmt: skip
    for k, val in rows:
        console.print(f"  {k:<24} {val}")
    if ok:
        console.print("[bold green]VERIFIED[/]: read model == journal replay, each event exactly once")
    else:
        console.print("[bold red]VERIFICATION FAILED[/]: see the figures above and the worker logs")
    return ok
