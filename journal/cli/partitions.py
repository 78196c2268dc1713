"""``journal partitions show`` and ``journal partitions move`` (docs/scaling-out.md)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from ..errors import InvalidArgument, JournalUnavailable
from ..ids import validate_slice_range
from ..settings import JournalSettings
from . import app
from .common import DatabasesOption, DataDirOption, DsnOption, SchemaOption, settings_from

partitions_app = typer.Typer(
    help="The journal over several databases: its partition map, and moving a slice range online.",
    no_args_is_help=True,
)
app.add_typer(partitions_app, name="partitions")


def partition_settings(schema: str | None, data_dir: object, databases: str | None) -> JournalSettings:
    """The settings with ``--databases`` (space-separated DSNs) applied."""
    return settings_from(schema, data_dir, databases)  # type: ignore[arg-type]


def parse_slices(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition("-")
    try:
        got = (int(lo), int(hi if sep else lo))
    except ValueError:
        raise InvalidArgument(f"--slices must look like 512-767, got {text!r}") from None
    validate_slice_range(*got)
    return got


@partitions_app.command("show")
def show(
    dsn: DsnOption = None,
    databases: DatabasesOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Which database serves each slice range, the map epoch, and the moves under way."""
    from ..backends import open_partitioned
    from ..journal import resolve_dsn
    from ..partitioned.move import move_state

    settings = partition_settings(schema, data_dir, databases)

    down: list[str] = []

    async def go() -> list[str]:
        backend = await open_partitioned(resolve_dsn(dsn, settings), settings)
        try:
            dbs = backend.dbs
            lines = [f"map epoch {dbs.map.epoch}"]
            lines += [f"  slices {lo:>4}-{hi:<4} {name}" for lo, hi, name in dbs.map.describe(dbs.names)]
            for i, name in enumerate(dbs.names):
                try:
                    b = await dbs.usable(i)
                    rows = await b.partitions().rows()
                    moves = await b.partitions().moves()
                except Exception as e:
                    lines.append(f"{name}: unavailable ({e})")
                    down.append(name)
                    continue
                lines.append(f"{name}:")
                lines += [f"  {r.min_slice}-{r.max_slice} {r.state} epoch {r.epoch}" for r in rows]
                lines += [f"  {await move_state(backend, i, m)}" for m in moves]
            return lines
        finally:
            await backend.close()

    for line in asyncio.run(go()):
        typer.echo(line)
    if down:  # the others are reported above; the exit code says that one is missing
        raise JournalUnavailable(f"unavailable: {', '.join(down)} (the other databases are reported above)")


@partitions_app.command("move")
def move(
    slices: Annotated[str, typer.Option("--slices", help="The range to move, e.g. 512-767.")],
    to: Annotated[str, typer.Option("--to", help="DSN of the database that will serve it.")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what the move would do; change nothing.")] = False,
    dsn: DsnOption = None,
    databases: DatabasesOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Move a slice range to another database while the journal runs (copy, fence, switch,
    removal). Run it again after an interruption: it finishes the move."""
    from ..backends import open_partitioned
    from ..journal import resolve_dsn
    from ..partitioned.move import SliceMove

    lo, hi = parse_slices(slices)
    settings = partition_settings(schema, data_dir, databases)

    async def go() -> list[str]:
        backend = await open_partitioned(resolve_dsn(dsn, settings), settings)
        try:
            mover = SliceMove(backend, lo, hi, to, say=typer.echo)
            if dry_run:
                return await mover.plan()
            r = await mover.run()
            rate = r.rows / r.copy_seconds if r.copy_seconds else 0.0
            return [
                f"moved slices {r.min_slice}-{r.max_slice} from {r.source} to {r.target} (map epoch {r.epoch})"
                + (f", resumed at step {r.resumed_from!r}" if r.resumed_from else ""),
                f"copied {r.rows} events and {r.states} durable states in {r.passes} passes "
                f"({rate:,.0f} rows/s while writes went on); "
                f"writes of the range waited at most {r.fence_seconds * 1000:.0f} ms; "
                f"removed {r.removed_pids} persistence ids from the source",
            ]
        finally:
            await backend.close()

    for line in asyncio.run(go()):
        typer.echo(line)
