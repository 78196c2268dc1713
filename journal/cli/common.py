"""Options and helpers shared by CLI commands."""

from __future__ import annotations

import asyncio
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
DataDirOption = Annotated[Path | None, typer.Option("--data-dir", help="Data directory of the embedded PostgreSQL.")]
DatabasesOption = Annotated[
    str | None,
    typer.Option(
        "--databases",
        help="The journal's databases, separated by spaces (default: $JOURNAL_DATABASES; else --dsn alone). "
        "The home database is --dsn, else the first of them.",
    ),
]

SubjectOfOption = Annotated[
    str | None,
    typer.Option(
        "--subject-of",
        help="Whose key encrypts a persistence id's payloads: package.module:function "
        "(default: $JOURNAL_SUBJECT_OF, else the persistence id).",
    ),
]
UpcastersOption = Annotated[
    str | None,
    typer.Option(
        "--upcasters",
        help="Upcasters of old rows: package.module:attribute, an Upcasters or a function returning one "
        "(default: $JOURNAL_UPCASTERS).",
    ),
]
SerializersOption = Annotated[
    str | None,
    typer.Option(
        "--serializers",
        help="Your SerializerRegistry: package.module:attribute, the registry or a function returning it "
        "(default: $JOURNAL_SERIALIZERS).",
    ),
]


def hook_settings(subject_of: str | None, upcasters: str | None, serializers: str | None) -> dict[str, Any]:
    """The hook options as settings overrides (an option not given leaves the environment's)."""
    return {"hooks.subject_of": subject_of, "hooks.upcasters": upcasters, "hooks.serializers": serializers}


def show_version(value: bool) -> None:
    """``--version``: the installed distribution's version."""
    if value:
        from importlib.metadata import version

        typer.echo(f"slice-journal {version('slice-journal')}")
        raise typer.Exit()


VersionOption = typer.Option(False, "--version", is_eager=True, callback=show_version, help="Print the version.")


def root_app(name: str, help: str) -> typer.Typer:
    """A command line of its own (``journal``, ``projections``): its failures said in one line
    (:class:`~.failures.HandledGroup`), click's help, and ``--version`` and ``--debug``."""
    from .failures import DebugOption, HandledGroup, set_debug

    app = typer.Typer(
        name=name,
        help=help,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        cls=HandledGroup,
        rich_markup_mode=None,  # click's help: wrapped at any width (rich's tables cut options at 80 columns)
    )

    @app.callback()
    def _root(version: bool = VersionOption, debug: bool = DebugOption) -> None:
        set_debug(debug)

    return app


def settings_from(
    schema: str | None = None, data_dir: Path | None = None, databases: str | None = None, **more: Any
) -> JournalSettings:
    """The settings (environment, then the options); ``databases``: ``--databases``, the
    journal's DSNs separated by spaces (else ``$JOURNAL_DATABASES``)."""
    if databases:
        more["databases"] = tuple(databases.split())
    return JournalSettings.load(schema=schema, data_dir=data_dir, **more)


def journal_hooks(settings: JournalSettings) -> dict[str, Any]:
    """The ``hooks`` settings loaded now, as :func:`~journal.open_journal`'s keywords: a hook that
    does not import or has the wrong type fails in one line before anything connects."""
    from ..hooks import resolve

    hooks = resolve(settings.hooks)
    return {"serializers": hooks.serializers, "subject_of": hooks.subject_of}


def target_dsn(dsn: str | None, settings: JournalSettings) -> tuple[str, bool]:
    """The DSN of the journal's home database, as :func:`~journal.open_journal` finds it, and
    whether it is the embedded server (started here when needed): ``--dsn``, else
    ``$JOURNAL_DSN``, else the first of ``partitions.databases``, else the embedded server."""
    from ..journal import resolve_dsn

    target = resolve_dsn(dsn, settings)
    if target:
        return target, False
    if settings.partitions.databases:
        return settings.partitions.databases[0], False
    from ..postgres import start_embedded

    return start_embedded(settings.connection.data_dir), True


def check_reachable(target: str, settings: JournalSettings) -> None:
    """Connect once first (timeout, retries said on stderr, errors as one line): a silent or
    refusing server fails in seconds, before Alembic's own connection would hang or trace."""
    from ..postgres import connect

    async def probe() -> None:
        await (await connect(target, settings)).close()

    asyncio.run(probe())


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)
