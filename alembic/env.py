"""Alembic environment for slice-journal.

DSN: ``-x dsn=...``, else the ``dsn`` attribute set by ``journal migrate``, else ``JOURNAL_DSN``.
Schema: ``-x schema=...``, else ``JOURNAL_SCHEMA``, else ``public``. The version table is
``slice_journal_alembic_version`` so an application's own Alembic history can share the database.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import create_engine, pool, text

from journal.postgres.dsn import sqlalchemy_url
from journal.postgres.schema import VERSION_TABLE, metadata
from journal.settings import validate_identifier

config = context.config
if config.config_file_name is not None and not config.attributes.get("quiet"):
    fileConfig(config.config_file_name, disable_existing_loggers=False)
x_args = context.get_x_argument(as_dictionary=True)
schema = validate_identifier(
    x_args.get("schema") or config.attributes.get("schema") or os.environ.get("JOURNAL_SCHEMA") or "public",
    "schema",
)
config.attributes["resolved_schema"] = schema  # for migrations that create schema-qualified functions
dsn = x_args.get("dsn") or config.attributes.get("dsn") or os.environ.get("JOURNAL_DSN")


def run_migrations_offline() -> None:
    context.configure(
        url=sqlalchemy_url(dsn) if dsn else "postgresql+psycopg://",
        target_metadata=metadata,
        literal_binds=True,
        version_table=VERSION_TABLE,
        version_table_schema=None if schema == "public" else schema,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        if schema != "public":
            context.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
            context.execute(f'SET search_path TO "{schema}"')
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    if not dsn:
        raise SystemExit(
            "no database: set JOURNAL_DSN, pass -x dsn=postgresql://..., "
            "or run `journal migrate` (which starts the embedded PostgreSQL)"
        )
    engine = create_engine(
        sqlalchemy_url(dsn),
        poolclass=pool.NullPool,
        connect_args={"options": f"-csearch_path={schema}"},
    )
    with engine.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
        conn.commit()
        _run(conn)
    engine.dispose()


def _run(conn: object) -> None:
    context.configure(
        connection=conn,  # type: ignore[arg-type]
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        version_table_schema=schema,
        compare_type=True,
        compare_server_default=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
