"""The recovery guard: while a location is rebuilt from its peers, the database refuses local writes.

Disaster recovery (``ReplicationEndpoint.recover``) must see no local write to a replicated log
until it has caught up: a local event written meanwhile would get a log position and vector
time from a log that does not yet hold what the location had before it was lost. Refusing in
the library's own write path is not enough: every process and every writer (a JVM service on
the same table) must be refused. So the guard is a BEFORE INSERT row trigger on event_journal,
installed when recovery starts and dropped when it completes. It refuses a row of a log whose
``replication_log.recovering`` flag is set, with SQLSTATE ``SJ014`` (mapped to
:class:`~journal.errors.LocalWritesRefused`), unless the transaction is the endpoint's
replicated write (``slice_journal.replicating = 'on'``, set transaction-locally). Nothing of a
refused statement is written. Installed only during recovery, so it costs ordinary writes nothing.
"""

from __future__ import annotations

from ..settings import validate_identifier
from .errors import LOCAL_WRITES_REFUSED_SQLSTATE

REPLICATING_SETTING = "slice_journal.replicating"
TRIGGER = "slice_journal_recovery_guard"

MARK_REPLICATED_SQL = f"SELECT set_config('{REPLICATING_SETTING}', 'on', true)"
"""Inside a replicated write's transaction: its rows pass the guard."""


def _names(schema: str) -> tuple[str, str, str]:
    validate_identifier(schema, "schema")
    return f'"{schema}".event_journal', f'"{schema}".replication_log', f'"{schema}".{TRIGGER}'


def install_sql(schema: str) -> str:
    table, logs, function = _names(schema)
    return f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $guard$
BEGIN
  IF EXISTS (SELECT 1 FROM {logs} WHERE log_name = NEW.entity_type AND recovering) THEN
    RAISE EXCEPTION USING ERRCODE = '{LOCAL_WRITES_REFUSED_SQLSTATE}',
      MESSAGE = format('log %s is being recovered from its peers: local writes are refused until '
                       'recovery completes', NEW.entity_type);
  END IF;
  RETURN NEW;
END
$guard$;
DROP TRIGGER IF EXISTS {TRIGGER} ON {table};
CREATE TRIGGER {TRIGGER} BEFORE INSERT ON {table} FOR EACH ROW
  WHEN (current_setting('{REPLICATING_SETTING}', true) IS DISTINCT FROM 'on')
  EXECUTE FUNCTION {function}();
"""


def remove_sql(schema: str) -> str:
    table, _, function = _names(schema)
    return f"DROP TRIGGER IF EXISTS {TRIGGER} ON {table};\nDROP FUNCTION IF EXISTS {function}();\n"


INSTALLED_SQL = (
    "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = $2 AND tgrelid = to_regclass($1) AND NOT tgisinternal)"
)
"""$1: the event_journal table as text, $2: the trigger name."""
