"""The timestamp rule's one home: the SQL every INSERT of event_journal builds db_timestamp from,
and the trigger that enforces it for other writers.

The rule itself is defined in docs/concepts.md ("The write rule", with why horizon mode stays
sound); here it is code: :data:`CLOCK` (one clock reading per statement, after its lock),
:func:`stamp` (per pid, per row) and :func:`settle` (the statement ends after its per-row steps).

Writers that do not follow it (JVM services) get it enforced by the database: the rule installed
here (``journal timestamp-rule install``) is a BEFORE INSERT row trigger that raises
``db_timestamp`` to ``clock_timestamp()`` — read inside the insert, after the lock — for every row
not written by this library (whose writer connections set ``slice_journal.writer = 'rule'``; they
already obey it). Akka Persistence R2DBC uses ``transaction_timestamp()``, taken when its
transaction began, before the lock: a stall between BEGIN and INSERT would otherwise let it commit
rows below a horizon that readers have already passed. Raising only ever moves a timestamp
forward, so the per-pid monotonic rule still holds, and RETURNING reports the raised value.
"""

from __future__ import annotations

from typing import Any

from ..settings import validate_identifier

WRITER_SETTING = "slice_journal.writer"
"""Custom setting this library's write connections carry; the trigger skips their rows."""
WRITER_VALUE = "rule"
TRIGGER = "slice_journal_timestamp_rule"

MICROSECOND = "interval '1 microsecond'"

CLOCK = "clock AS MATERIALIZED (SELECT clock_timestamp() AS t)"
"""The CTE every insert reads its one clock reading from (``(SELECT t FROM clock)``)."""


def stamp(prev: str, n: str) -> str:
    """The db_timestamp of the ``n``-th row (1-based) of a statement whose pid's (or pids')
    newest stored timestamp is ``prev`` (NULL: none). Needs :data:`CLOCK` in the statement."""
    return f"GREATEST((SELECT t FROM clock), {prev} + {MICROSECOND}) + ({n} - 1) * {MICROSECOND}"


def settle(inserted: str) -> str:
    """A select-list expression (true) that waits, if it must, until the clock has passed the
    last per-row step of the rows of the data-modifying CTE ``inserted`` (it needs a RETURNING).
    Reading that CTE makes it run after the rows are inserted; it then costs one clock reading,
    since inserting a row takes longer than a microsecond."""
    last = f"(SELECT t FROM clock) + ((SELECT count(*) FROM {inserted}) - 1) * {MICROSECOND}"
    return f"(SELECT true FROM pg_sleep(GREATEST(0, extract(epoch FROM {last} - clock_timestamp()))))"


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
