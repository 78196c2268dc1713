"""The ``projections`` command line."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="projections",
    help="Run and manage projection workers over the slice journal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """Projection workers: run, status, pause, resume, reset, Spark backfill and export."""


def main() -> None:
    from journal.cli import main as journal_main  # same error handling

    _ = journal_main
    app()
