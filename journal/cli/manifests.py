"""``journal manifests``: which manifests and versions are stored, with counts."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer

from . import app
from .common import DatabasesOption, DataDirOption, DsnOption, SchemaOption, settings_from, target_dsn


@app.command()
def manifests(
    dsn: DsnOption = None,
    databases: DatabasesOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
    registry: Annotated[
        str | None,
        typer.Option(
            "--registry",
            help="Your SerializerRegistry as package.module:attribute: marks the manifests its upcasters read.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Stored manifests by kind (event, snapshot), serializer id, name and version, with counts."""
    from ..journal import open_journal
    from ..serialization import SerializerRegistry

    serializers = _load_registry(registry) if registry else SerializerRegistry()
    settings = settings_from(schema, data_dir, databases)
    target, _ = target_dsn(dsn, settings)

    async def go() -> list[Any]:
        async with open_journal(target, settings=settings, serializers=serializers) as j:
            return await j.stored_manifests()

    rows = asyncio.run(go())
    if as_json:
        typer.echo(json.dumps([r._asdict() for r in rows], indent=2))
        return
    typer.echo(f"{'kind':9} {'ser_id':>6} {'version':>7} {'sealed':>6} {'rows':>10}  manifest")
    for r in rows:
        mark = "  (upcast)" if r.upcast else ""
        typer.echo(f"{r.kind:9} {r.ser_id:>6} {r.version:>7} {r.sealed:>6} {r.rows:>10}  {r.name or '(none)'}{mark}")


def _load_registry(spec: str) -> Any:
    import importlib

    from ..errors import ConfigurationError
    from ..serialization import SerializerRegistry

    module_name, sep, attr = spec.partition(":")
    if not sep:
        raise ConfigurationError(f"--registry must look like 'package.module:attribute', got {spec!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigurationError(f"cannot import {module_name!r}: {e}") from e
    for part in attr.split("."):
        obj = getattr(obj, part, None)
    if callable(obj) and not isinstance(obj, SerializerRegistry):
        obj = obj()
    if not isinstance(obj, SerializerRegistry):
        raise ConfigurationError(f"{spec!r} is not a SerializerRegistry (or a function returning one)")
    return obj
