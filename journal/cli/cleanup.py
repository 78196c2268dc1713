"""``journal cleanup delete-all|delete-snapshots|delete-before-snapshot PID... [--pids-from FILE]`` and
``journal cleanup delete-state-tombstones --before TIME``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from ..cleanup import Cleanup, CleanupAction, PidResult, read_pids, validate_pids
from ..errors import InvalidArgument
from . import app
from .common import DatabasesOption, DataDirOption, SchemaOption, settings_from

cleanup_app = typer.Typer(
    help="Delete events, tag rows and snapshots of given persistence ids (entities must not be running), "
    "or old durable state tombstones. "
    "Every step is idempotent: re-run an interrupted cleanup to finish it.",
    no_args_is_help=True,
)
app.add_typer(cleanup_app, name="cleanup")

PidsArg = Annotated[list[str] | None, typer.Argument(help="Persistence ids.", show_default=False)]
PidsFromOption = Annotated[
    Path | None, typer.Option("--pids-from", help="A file of persistence ids, one per line ('#' comments).")
]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="Show what would be deleted; delete nothing.")]
DoneFileOption = Annotated[
    Path | None,
    typer.Option(
        "--done-file",
        help="Append each finished pid to this file and skip the pids already in it (a re-run continues).",
    ),
]
TargetOption = Annotated[
    str | None,
    typer.Option(
        "--dsn",
        help="PostgreSQL DSN or cassandra://host1,host2[:port]/keyspace (default: $JOURNAL_DSN, else embedded).",
    ),
]


def _pids(pids: list[str] | None, pids_from: Path | None) -> list[str]:
    out = list(pids or []) + (read_pids(pids_from) if pids_from is not None else [])
    if not out:
        raise InvalidArgument("no persistence ids: give them as arguments or with --pids-from FILE")
    return validate_pids(out)


def _describe(r: PidResult) -> str:
    b = r.before
    snap = "no snapshot" if b.snapshot_seq_nr is None else f"snapshot at {b.snapshot_seq_nr}"
    line = f"{r.persistence_id}: {b.events} event rows (highest {b.highest_seq_nr}), {b.tag_rows} tag rows, {snap}"
    if r.skipped:
        line += f" -- skipped: {r.skipped}"
    elif r.after is not None:
        a = r.after
        line += f" -> {a.events} event rows, {a.tag_rows} tag rows, "
        line += "no snapshot" if a.snapshot_seq_nr is None else f"snapshot at {a.snapshot_seq_nr}"
    return line


def _run(
    action: CleanupAction,
    pids: list[str] | None,
    pids_from: Path | None,
    dsn: str | None,
    schema: str | None,
    data_dir: Path | None,
    dry_run: bool,
    done_file: Path | None,
    verbose: bool,
    reset_seq_nr: bool = False,
    databases: str | None = None,
) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from ..journal import open_journal

    todo = _pids(pids, pids_from)
    done: set[str] = set()
    if done_file is not None and done_file.exists():
        done = set(read_pids(done_file))
    skipped_done = sum(1 for p in todo if p in done)
    todo = [p for p in todo if p not in done]
    settings = settings_from(schema, data_dir, databases)
    results: list[PidResult] = []

    async def go() -> None:
        async with open_journal(dsn, settings=settings) as journal:
            tool = Cleanup(journal.backend, dry_run=dry_run)
            progress = Progress(
                TextColumn(f"{action.value}{' (dry run)' if dry_run else ''}"), BarColumn(), MofNCompleteColumn(),
                TimeRemainingColumn(), console=Console(stderr=True), transient=False,
            )  # fmt: skip
            log_to = done_file.open("a", encoding="utf-8") if done_file and not dry_run else nullcontext()
            with progress, log_to as log:
                task = progress.add_task(action.value, total=len(todo))

                def on_done(r: PidResult) -> None:
                    results.append(r)
                    if log is not None:
                        log.write(r.persistence_id + "\n")
                        log.flush()
                    progress.advance(task)

                await tool.run(action, todo, reset_seq_nr=reset_seq_nr, on_done=on_done)

    asyncio.run(go())
    if dry_run or verbose:
        for r in results:
            typer.echo(_describe(r))
    events = sum(r.before.events - (r.after.events if r.after else 0) for r in results if not r.skipped)
    tag_rows = sum(r.before.tag_rows - (r.after.tag_rows if r.after else 0) for r in results if not r.skipped)
    snaps = sum(
        1 for r in results
        if not r.skipped and r.before.snapshot_seq_nr is not None
        and (r.after is None or r.after.snapshot_seq_nr is None)
    )  # fmt: skip
    verb = "would delete" if dry_run else "deleted"
    typer.echo(
        f"{action.value}: {len(results)} pids, {verb} {events} event rows, {tag_rows} tag rows, {snaps} snapshots"
        + (f"; {skipped_done} pids already done ({done_file})" if skipped_done else "")
    )


VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="One line per pid.")]


@cleanup_app.command("delete-all")
def delete_all(
    pids: PidsArg = None,
    pids_from: PidsFromOption = None,
    dsn: TargetOption = None,
    databases: DatabasesOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
    dry_run: DryRunOption = False,
    done_file: DoneFileOption = None,
    verbose: VerboseOption = False,
    reset_seq_nr: Annotated[
        bool,
        typer.Option("--reset-seq-nr", help="Forget the pids entirely, tag writer progress too (they may start at 1)."),
    ] = False,
) -> None:
    """Delete all events, tag rows and snapshots of the pids (their sequence and tag numbering is
    kept, so a pid started again continues after it, unless --reset-seq-nr)."""
    _run(
        CleanupAction.DELETE_ALL,
        pids,
        pids_from,
        dsn,
        schema,
        data_dir,
        dry_run,
        done_file,
        verbose,
        reset_seq_nr,
        databases,
    )


def _pids_command(action: CleanupAction, summary: str) -> Callable[..., None]:
    """The command of ``action``: the options of every cleanup of pids, ``summary`` its help."""

    def command(
        pids: PidsArg = None,
        pids_from: PidsFromOption = None,
        dsn: TargetOption = None,
        databases: DatabasesOption = None,
        schema: SchemaOption = None,
        data_dir: DataDirOption = None,
        dry_run: DryRunOption = False,
        done_file: DoneFileOption = None,
        verbose: VerboseOption = False,
    ) -> None:
        _run(action, pids, pids_from, dsn, schema, data_dir, dry_run, done_file, verbose, databases=databases)

    command.__doc__ = summary
    return command


cleanup_app.command("delete-snapshots")(
    _pids_command(CleanupAction.DELETE_SNAPSHOTS, "Delete only the snapshots of the pids.")
)
cleanup_app.command("delete-before-snapshot")(
    _pids_command(
        CleanupAction.DELETE_BEFORE_SNAPSHOT,
        "Delete the events of each pid up to its snapshot's sequence number (pids without one are skipped).",
    )
)


def _before(text: str) -> datetime:
    try:
        before = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(f"--before: not an ISO 8601 time: {text!r} (e.g. 2026-11-01T00:00:00+00:00)") from None
    if before.tzinfo is None:
        raise InvalidArgument(f"--before: give a timezone (e.g. {text}+00:00 or {text}Z): {text!r} has none")
    return before


@cleanup_app.command("delete-state-tombstones")
def delete_state_tombstones(
    before: Annotated[
        str,
        typer.Option("--before", help="Delete the tombstones written before this time (ISO 8601 with a timezone)."),
    ],
    dsn: TargetOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
    dry_run: DryRunOption = False,
) -> None:
    """Delete the durable state tombstones (deleted states) written before --before. Their pids
    have no row afterwards (revisions start again at 1), and a changes-by-slices query that had
    not read a delete yet never sees it: pick a time older than any projection's lag."""
    from ..journal import open_journal

    cutoff = _before(before)
    settings = settings_from(schema, data_dir, None)

    async def go() -> int:
        async with open_journal(dsn, settings=settings) as journal:
            return await journal.durable_state().delete_tombstones(cutoff, dry_run=dry_run)

    n = asyncio.run(go())
    typer.echo(f"{'would delete' if dry_run else 'deleted'} {n} durable state tombstones written before {cutoff}")
