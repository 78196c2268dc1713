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
from . import insert_trigger
from .errors import LOCAL_WRITES_REFUSED_SQLSTATE

REPLICATING_SETTING = "slice_journal.replicating"
TRIGGER = "slice_journal_recovery_guard"

MARK_REPLICATED_SQL = f"SELECT set_config('{REPLICATING_SETTING}', 'on', true)"
"""Inside a replicated write's transaction: its rows pass the guard."""


def install_sql(schema: str) -> str:
    validate_identifier(schema, "schema")
    body = f"""\
  IF EXISTS (SELECT 1 FROM "{schema}".replication_log WHERE log_name = NEW.entity_type AND recovering) THEN
    RAISE EXCEPTION USING ERRCODE = '{LOCAL_WRITES_REFUSED_SQLSTATE}',
      MESSAGE = format('log %s is being recovered from its peers: local writes are refused until '
                       'recovery completes', NEW.entity_type);
  END IF;
  RETURN NEW;"""
    return insert_trigger.install_sql(schema, TRIGGER, body, REPLICATING_SETTING, "on")


def remove_sql(schema: str) -> str:
    return insert_trigger.remove_sql(schema, TRIGGER)


INSTALLED_SQL = insert_trigger.INSTALLED_SQL
"""$1: the event_journal table as text, $2: the trigger name."""
