"""Run this library's Alembic migrations programmatically (``journal migrate``).

Works from an installed wheel: the migration scripts ship inside the package as
``journal/_alembic``; in a source checkout the top-level ``alembic/`` directory is used.

Failures come out as the library's errors (a wrong password, an unknown revision: a
:class:`ConfigurationError`; a server that went away: :class:`JournalUnavailable`), and a
downgrade says which tables it would drop (:func:`downgrade_drops`) before it drops them.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

import sqlalchemy
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError

from ..errors import ConfigurationError, JournalUnavailable, StorageError
from ..settings import validate_identifier
from .dsn import sqlalchemy_url, target_of
from .schema import VERSION_TABLE

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def script_location() -> Path:
    """Where the migration scripts are: inside the wheel, or the checkout's ``alembic/``."""
    for candidate in (_PACKAGE_DIR / "_alembic", _PACKAGE_DIR.parent / "alembic"):
        if (candidate / "env.py").is_file():
            return candidate
    raise ConfigurationError("migration scripts not found (neither journal/_alembic nor ./alembic)")


def alembic_config(dsn: str | None, schema: str = "public") -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    cfg.attributes["dsn"] = dsn
    cfg.attributes["schema"] = validate_identifier(schema, "schema")
    return cfg


@contextmanager
def _mapped(what: str, dsn: str | None) -> Iterator[None]:
    """Alembic's and the driver's errors as the library's, naming the server and the cause."""
    where = target_of(dsn) if dsn else "the offline script"
    try:
        yield
    except CommandError as e:
        raise ConfigurationError(f"{what}: {e}") from e
    except sqlalchemy.exc.DBAPIError as e:
        sqlstate = getattr(e.orig, "sqlstate", None) or ""
        cause = " ".join(str(e.orig).split()) if e.orig is not None else str(e)
        if isinstance(e, sqlalchemy.exc.OperationalError) and not sqlstate.startswith(("28", "3D")):
            raise JournalUnavailable(f"{what}: {where} unavailable: {cause}") from e
        if sqlstate.startswith(("28", "3D", "42501")):
            raise ConfigurationError(f"cannot {what} {where}: {cause}") from e
        raise StorageError(f"{what} on {where} failed: {cause}") from e


def check_revision(revision: str) -> None:
    """An unknown ``revision`` is a ConfigurationError that lists the known ones."""
    if revision in ("head", "heads", "base"):
        return
    scripts = ScriptDirectory.from_config(alembic_config(None))
    try:
        found = scripts.get_revision(revision)
    except CommandError:
        found = None
    if found is None:
        known = ", ".join(r.revision for r in reversed(list(scripts.walk_revisions())))
        raise ConfigurationError(f"unknown revision {revision!r}: the migrations are {known} (or head, base)")


def upgrade(dsn: str, schema: str = "public", revision: str = "head") -> None:
    check_revision(revision)
    with _mapped("migrate", dsn):
        command.upgrade(alembic_config(dsn, schema), revision)


def downgrade(dsn: str, schema: str = "public", revision: str = "base") -> None:
    check_revision(revision)
    with _mapped("downgrade", dsn):
        command.downgrade(alembic_config(dsn, schema), revision)


def current_revision(dsn: str, schema: str = "public") -> str | None:
    """The revision the database is at (None: not migrated)."""
    with _mapped("read the schema revision of", dsn), _engine(dsn) as engine, engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE, "version_table_schema": schema})
        return ctx.get_current_revision()


_DROP = re.compile(r'^DROP TABLE (?:"?\w+"?\.)?"?(\w+)"?', re.M | re.I)


def downgrade_drops(dsn: str, schema: str = "public", revision: str = "base") -> dict[str, int]:
    """The tables a downgrade to ``revision`` would drop, with the rows each holds now (read from
    the migrations' own DDL, so no list of tables is kept here)."""
    check_revision(revision)
    current = current_revision(dsn, schema)
    if current is None:
        return {}
    buf = io.StringIO()
    cfg = alembic_config(None, schema)
    cfg.output_buffer = buf
    with _mapped("plan the downgrade of", dsn), redirect_stdout(buf):
        command.downgrade(cfg, f"{current}:{revision}", sql=True)
    tables = [t for t in dict.fromkeys(_DROP.findall(buf.getvalue())) if t != VERSION_TABLE]
    with _mapped("count the rows of", dsn), _engine(dsn) as engine, engine.connect() as conn:
        present = set(sqlalchemy.inspect(conn).get_table_names(schema=schema))
        count = sqlalchemy.select(sqlalchemy.func.count())
        return {
            t: int(conn.execute(count.select_from(sqlalchemy.table(t, schema=schema))).scalar_one())
            for t in tables
            if t in present
        }


@contextmanager
def _engine(dsn: str) -> Iterator[sqlalchemy.Engine]:
    engine = sqlalchemy.create_engine(sqlalchemy_url(dsn), poolclass=sqlalchemy.pool.NullPool)
    try:
        yield engine
    finally:
        engine.dispose()


def offline_sql(schema: str = "public", revision: str = "head") -> str:
    """The DDL a DBA can review and apply by hand."""
    check_revision(revision)
    buf = io.StringIO()
    cfg = alembic_config(None, schema)
    cfg.output_buffer = buf
    with redirect_stdout(buf):
        command.upgrade(cfg, revision, sql=True)
    return buf.getvalue()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config(None)).get_current_head()
