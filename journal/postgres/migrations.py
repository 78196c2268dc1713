"""Run this library's Alembic migrations programmatically (``journal migrate``).

Works from an installed wheel: the migration scripts ship inside the package as
``journal/_alembic``; in a source checkout the top-level ``alembic/`` directory is used.
"""

from __future__ import annotations

import io
from contextlib import redirect_stdout
from pathlib import Path

from alembic.config import Config

from alembic import command

from ..errors import ConfigurationError
from ..settings import validate_identifier

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


def upgrade(dsn: str, schema: str = "public", revision: str = "head") -> None:
    command.upgrade(alembic_config(dsn, schema), revision)


def downgrade(dsn: str, schema: str = "public", revision: str = "base") -> None:
    command.downgrade(alembic_config(dsn, schema), revision)


def offline_sql(schema: str = "public", revision: str = "head") -> str:
    """The DDL a DBA can review and apply by hand."""
    buf = io.StringIO()
    cfg = alembic_config(None, schema)
    cfg.output_buffer = buf
    with redirect_stdout(buf):
        command.upgrade(cfg, revision, sql=True)
    return buf.getvalue()


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config(None)).get_current_head()
