"""``journal manifests``: which manifests and versions are stored, with counts."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer

from . import app
from .common import (
    DatabasesOption,
    DataDirOption,
    DsnOption,
    SchemaOption,
    UpcastersOption,
    hook_settings,
    journal_hooks,
    settings_from,
    target_dsn,
)


@app.command()
def manifests(
    dsn: DsnOption = None,
    databases: DatabasesOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
    registry: Annotated[
        str | None,
        typer.Option(
            "--serializers",
            "--registry",
            help="Your SerializerRegistry as package.module:attribute: marks the manifests its upcasters read "
            "(default: $JOURNAL_SERIALIZERS).",
        ),
    ] = None,
    upcasters: UpcastersOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Stored manifests by kind (event, snapshot), serializer id, name and version, with counts."""
    from ..journal import open_journal

    settings = settings_from(schema, data_dir, databases, **hook_settings(None, upcasters, registry))
    hooks = journal_hooks(settings)
    target, _ = target_dsn(dsn, settings)

    async def go() -> list[Any]:
        async with open_journal(target, settings=settings, **hooks) as j:
            return await j.stored_manifests()

    rows = asyncio.run(go())
    if as_json:
        typer.echo(json.dumps([r._asdict() for r in rows], indent=2))
        return
    typer.echo(f"{'kind':9} {'ser_id':>6} {'version':>7} {'sealed':>6} {'rows':>10}  manifest")
    for r in rows:
        mark = "  (upcast)" if r.upcast else ""
        typer.echo(f"{r.kind:9} {r.ser_id:>6} {r.version:>7} {r.sealed:>6} {r.rows:>10}  {r.name or '(none)'}{mark}")
