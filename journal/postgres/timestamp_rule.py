"""The write rule enforced by the database, for writers that do not follow it (JVM services).

Horizon mode (:mod:`journal.query.horizon`) is sound when every row's db_timestamp is read from
the clock *after* its statement holds RowExclusiveLock on event_journal. This library's insert
does that. Akka Persistence R2DBC does not: it uses ``transaction_timestamp()``, taken when its
transaction began, before the lock; an atomic write of several events sends BEGIN first, so a
stall between BEGIN and INSERT (a GC pause, the network) lets it commit rows below a horizon
that readers have already passed, and horizon mode misses them.

The rule installed here is a BEFORE INSERT row trigger that raises ``db_timestamp`` to
``clock_timestamp()`` — read inside the insert, after the lock — for every row not written by
this library (whose writer connections set ``slice_journal.writer = 'rule'``; they already obey
it, and one timestamp per call is kept for them). Raising only ever moves a timestamp forward,
so the per-pid monotonic rule still holds, and RETURNING reports the raised value to the plugin.
"""

from __future__ import annotations

from typing import Any

from ..settings import validate_identifier

WRITER_SETTING = "slice_journal.writer"
"""Custom setting this library's write connections carry; the trigger skips their rows."""
WRITER_VALUE = "rule"
TRIGGER = "slice_journal_timestamp_rule"


def _names(schema: str) -> tuple[str, str]:
    validate_identifier(schema, "schema")
    return f'"{schema}".event_journal', f'"{schema}".{TRIGGER}'


def install_sql(schema: str) -> str:
    table, function = _names(schema)
    return f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $rule$
BEGIN
  NEW.db_timestamp := GREATEST(NEW.db_timestamp, clock_timestamp());
  RETURN NEW;
END
$rule$;
DROP TRIGGER IF EXISTS {TRIGGER} ON {table};
CREATE TRIGGER {TRIGGER} BEFORE INSERT ON {table} FOR EACH ROW
  WHEN (current_setting('{WRITER_SETTING}', true) IS DISTINCT FROM '{WRITER_VALUE}')
  EXECUTE FUNCTION {function}();
"""


def remove_sql(schema: str) -> str:
    table, function = _names(schema)
    return f"DROP TRIGGER IF EXISTS {TRIGGER} ON {table};\nDROP FUNCTION IF EXISTS {function}();\n"


INSTALLED_SQL = (
    "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = $2 AND tgrelid = to_regclass($1) AND NOT tgisinternal)"
)
"""$1: the event_journal table as text, $2: the trigger name."""

MARK_WRITER_LOCAL_SQL = f"SELECT set_config('{WRITER_SETTING}', '{WRITER_VALUE}', true)"
"""Inside a caller's transaction (persist_in): this transaction's rows already obey the rule."""


async def install(conn: Any, schema: str = "public") -> None:
    """Enforce the write rule for every writer of ``schema``.event_journal (idempotent)."""
    async with conn.transaction():
        await conn.execute(install_sql(schema))


async def remove(conn: Any, schema: str = "public") -> None:
    async with conn.transaction():
        await conn.execute(remove_sql(schema))


async def installed(conn: Any, schema: str = "public") -> bool:
    table, _ = _names(schema)
    return bool(await conn.fetchval(INSTALLED_SQL, table, TRIGGER))
