"""``journal forget``: crypto-shredding from the command line (docs/encryption.md).

It opens the journal as its services do (``--databases`` / ``JOURNAL_DATABASES``: the key store
is in the home database, as for the library) and refuses, with exit code 2, what would answer
success while forgetting nothing: a journal that does not encrypt (``codec.encrypt`` off: it has
no keys) and a subject with no stored key (a typo, or nothing of it was encrypted) unless
``--force`` asks to mark it forgotten ahead of any write.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from ..errors import ConfigurationError, InvalidArgument
from . import app
from .common import DatabasesOption, DataDirOption, DsnOption, SchemaOption
from .partitions import partition_settings


@app.command()
def forget(
    subject: Annotated[str, typer.Argument(help="The subject whose key goes (by default a persistence id).")],
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    data_dir: DataDirOption = None,
    databases: DatabasesOption = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Mark a subject with no stored key forgotten (no key is ever made for it)."),
    ] = False,
) -> None:
    """Crypto-shredding: delete a subject's encryption key for good (its payloads become unreadable).

    Needs the writers' settings: JOURNAL_CODEC_ENCRYPT=true, and JOURNAL_DATABASES when the
    journal has several databases. Refuses a subject with no stored key unless --force."""
    from ..journal import open_journal

    settings = partition_settings(schema, data_dir, databases)
    if not settings.codec.encrypt:
        raise ConfigurationError(
            "this journal does not encrypt (codec.encrypt is off): it has no keys, so forget would leave every "
            "event readable; if its writers encrypt, run with JOURNAL_CODEC_ENCRYPT=true as they do"
        )

    async def go() -> str:
        async with open_journal(dsn, settings=settings) as j:
            state = await j.key_state(subject)
            if state == "forgotten":
                return f"{subject} was already forgotten"
            if state == "none" and not force:
                raise InvalidArgument(
                    f"no key is stored for {subject!r}: nothing of it was encrypted (a typo? a subject is a "
                    "persistence id unless the writers map it with subject_of); --force marks it forgotten ahead"
                )
            await j.forget(subject)
            if state == "none":
                return f"{subject} had no key: marked forgotten (no key will ever be made for it)"
            ttl = settings.codec.key_cache_ttl
            return f"forgot {subject}: its encrypted payloads are unreadable (in running processes within {ttl:g} s)"

    typer.echo(asyncio.run(go()))
