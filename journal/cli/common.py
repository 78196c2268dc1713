"""Options and helpers shared by CLI commands."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from ..settings import JournalSettings

T = TypeVar("T")

DsnOption = Annotated[
    str | None,
    typer.Option("--dsn", help="PostgreSQL DSN (default: $JOURNAL_DSN, else the embedded server)."),
]
SchemaOption = Annotated[
    str | None, typer.Option("--schema", help="Schema of the journal tables (default: $JOURNAL_SCHEMA or public).")
]
DataDirOption = Annotated[
    Path | None, typer.Option("--data-dir", help="Data directory of the embedded PostgreSQL.")
]


def settings_from(schema: str | None = None, data_dir: Path | None = None, **more: Any) -> JournalSettings:
    return JournalSettings.load(schema=schema, data_dir=data_dir, **more)


def target_dsn(dsn: str | None, settings: JournalSettings) -> tuple[str, bool]:
    """The DSN to use and whether it is the embedded server (started here when needed)."""
    dsn = dsn or settings.connection.dsn or os.environ.get("JOURNAL_DSN")
    if dsn:
        return dsn, False
    from ..postgres.embedded import start_embedded

    return start_embedded(settings.connection.data_dir), True


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)
