"""A BEFORE INSERT row trigger on event_journal that writes marked by a transaction-local setting
pass: how both the timestamp rule (:mod:`.timestamp_rule`) and the recovery guard
(:mod:`.recovery_guard`) are installed, removed and looked for."""

from __future__ import annotations

from ..settings import validate_identifier


def table_and_function(schema: str, trigger: str) -> tuple[str, str]:
    """The trigger's table (event_journal) and its function (named as the trigger), qualified."""
    validate_identifier(schema, "schema")
    return f'"{schema}".event_journal', f'"{schema}".{trigger}'


def install_sql(schema: str, trigger: str, body: str, setting: str, passing: str) -> str:
    """Create (or replace) the function of ``body`` (plpgsql, between BEGIN and END) and the
    trigger calling it for every row of a transaction whose ``setting`` is not ``passing``."""
    table, function = table_and_function(schema, trigger)
    return f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
{body}
END
$body$;
DROP TRIGGER IF EXISTS {trigger} ON {table};
CREATE TRIGGER {trigger} BEFORE INSERT ON {table} FOR EACH ROW
  WHEN (current_setting('{setting}', true) IS DISTINCT FROM '{passing}')
  EXECUTE FUNCTION {function}();
"""


def remove_sql(schema: str, trigger: str) -> str:
    table, function = table_and_function(schema, trigger)
    return f"DROP TRIGGER IF EXISTS {trigger} ON {table};\nDROP FUNCTION IF EXISTS {function}();\n"


INSTALLED_SQL = (
    "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = $2 AND tgrelid = to_regclass($1) AND NOT tgisinternal)"
)
"""$1: the event_journal table as text, $2: the trigger name."""
