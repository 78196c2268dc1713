"""The timestamp rule's one home: the SQL every INSERT of event_journal builds db_timestamp from,
and the trigger that enforces it for other writers.

The rule itself is defined in docs/concepts.md ("The write rule", with why horizon mode stays
sound); here it is code: :func:`clock` (one clock reading per statement, after its lock and the owner check),
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
from . import insert_trigger

WRITER_SETTING = "slice_journal.writer"
"""Custom setting this library's write connections carry; the trigger skips their rows."""
WRITER_VALUE = "rule"
TRIGGER = "slice_journal_timestamp_rule"

MICROSECOND = "interval '1 microsecond'"

CHECK_FUNCTION = "slice_journal_check"
"""The function every statement of the journal that writes or reads by slice calls (its owner
check, and for writes the clock reading): :func:`check_function_sql`."""


def _covered(schema: str, epoch: str, slices: str, states: str, bounds: str | None = None) -> str:
    """The fast path of the owner check, inline in a statement: one row of ``slice_partition``
    in one of ``states`` covers every slice of ``slices`` (from its least to its greatest) at
    an epoch the writer knows. Anything else (no such row, or a database that was never
    partitioned) goes to the exact check (:func:`check_function_sql`). ``bounds``: a FROM item
    ``b(lo, hi)`` of the least and greatest slice when the statement has them without ``slices``."""
    parts = f'"{schema}".slice_partition'
    bounds = bounds or f"(SELECT min(x) AS lo, max(x) AS hi FROM unnest({slices}::int[]) x) b"
    return (
        f"{bounds} LEFT JOIN LATERAL ("
        f"SELECT true AS ok, p.floor FROM {parts} p WHERE p.min_slice <= b.lo AND p.max_slice >= b.hi "
        f"AND p.state IN ({states}) AND p.epoch <= {epoch}::bigint LIMIT 1) c ON true"
    )


def clock(schema: str, epoch: str, slices: str) -> str:
    """The CTE every insert reads its one clock reading from (``(SELECT t FROM clock)``): the
    database's owner check of the statement's ``slices`` (an int[] expression) for a writer whose
    partition map has ``epoch`` (a bigint expression), then the clock, raised to the floor of
    the slices' range. The common case (one owned range covers the slices, or a database never
    partitioned) is decided inline; anything else calls the exact check, which raises when
    this database does not hold those slices for writes (:func:`check_function_sql`)."""
    return f"clock AS MATERIALIZED ({_clock_select(schema, epoch, slices)})"


def clock_of_one(schema: str, epoch: str, slice_: str) -> str:
    """:func:`clock` for a statement that writes one slice (an int expression), as a FROM item
    ``k(t)`` (a FROM item runs whether or not the statement's row is then inserted). It reads
    ``slice_partition`` once, as an aggregate (the table holds a database's few ranges): no row
    at all (never partitioned) or a range covering the slice that the writer may write (its
    floor) decides it inline, anything else calls the exact check. One scan of the table where
    :func:`clock` has two (the covering range, then whether there is any row): about 3 µs of
    the server's time per call (``benchmarks/write_breakdown.py --only lone``)."""
    ok = f"p.min_slice <= {slice_} AND p.max_slice >= {slice_} AND p.state IN ({_WRITABLE})"
    ok += f" AND p.epoch <= {epoch}::bigint"
    return (
        f"(SELECT CASE WHEN count(*) = 0 THEN clock_timestamp() "
        f"WHEN bool_or(p.ok) THEN GREATEST(clock_timestamp(), max(p.floor) FILTER (WHERE p.ok)) "
        f"ELSE {_function(schema)}({epoch}::bigint, ARRAY[{slice_}]::int[], 'write') END AS t "
        f'FROM (SELECT p.floor, {ok} AS ok FROM "{schema}".slice_partition p) p) k'
    )


def _clock_select(schema: str, epoch: str, slices: str, bounds: str | None = None) -> str:
    fn = _function(schema)
    return (
        f"SELECT CASE WHEN c.ok THEN GREATEST(clock_timestamp(), c.floor) "
        f'WHEN NOT EXISTS (SELECT 1 FROM "{schema}".slice_partition) THEN clock_timestamp() '
        f"ELSE {fn}({epoch}::bigint, {slices}::int[], 'write') END AS t "
        f"FROM {_covered(schema, epoch, slices, _WRITABLE, bounds)}"
    )


def read_check(schema: str, epoch: str, slices: str) -> str:
    """A predicate that raises unless this database serves ``slices`` for reads (a slice page,
    the next-timestamp probe): evaluated once per statement (an uncorrelated subquery)."""
    fn = _function(schema)
    return (
        f'(SELECT CASE WHEN c.ok THEN true WHEN NOT EXISTS (SELECT 1 FROM "{schema}".slice_partition) THEN true '
        f"ELSE {fn}({epoch}::bigint, {slices}::int[], 'read') IS NOT NULL END "
        f"FROM {_covered(schema, epoch, slices, _READABLE)})"
    )


_WRITABLE = "'owned', 'moving'"
_READABLE = "'owned', 'moving', 'fenced'"


def delete_check_sql(schema: str) -> str:
    """The statement a deleting transaction runs first: it takes the write lock, then raises
    unless this database serves the slices ($2) for deletes. $1: the writer's map epoch."""
    return f"SELECT {_function(schema)}($1::bigint, $2::int[], 'delete')"


def fence_key(schema: str) -> int:
    """The first key of the advisory lock a move holds while it fences a range (the second is
    the range's first slice); a signed 32-bit int per schema."""
    import zlib

    return zlib.crc32(f"slice_journal.fence.{schema}".encode()) - 2**31


def mover_key(schema: str) -> int:
    """The first key of the advisory lock a move holds on its source for as long as it runs (the
    second is the range's first slice): while nobody holds it, no move of that range is alive,
    and a process waiting for the range finishes or undoes what the dead move left
    (docs/scaling-out.md, "When a move is interrupted")."""
    import zlib

    return zlib.crc32(f"slice_journal.mover.{schema}".encode()) - 2**31


def _function(schema: str) -> str:
    validate_identifier(schema, "schema")
    return f'"{schema}".{CHECK_FUNCTION}'


def check_function_sql(schema: str) -> str:
    """The owner check of a database that may hold only some slices (docs/scaling-out.md).

    ``slice_partition`` says which slice ranges this database serves: no row at all means every
    slice (a database that was never partitioned). A range is ``owned``; ``moving`` while a move
    copies it away (writes and reads go on, deletes wait); ``fenced`` during the move's last copy
    (writes wait, unless the move's session holding the fence lock has gone: then the fence has
    lapsed); ``moved`` once another database serves it; ``incoming`` while it is copied here.

    ``slice_journal_check(epoch, slices, mode)`` raises SQLSTATE ``SJ025`` (wait: the range is
    moving or fenced) or ``SJ026`` (not here: moved, incoming, unknown, or the writer's map
    epoch is older than the range's) with the range as JSON in DETAIL; else it returns the
    clock, for writes raised to the ``floor`` of the ranges written (a moved range's new home
    never stamps an event below what readers of the old home passed). ``mode`` is ``write``,
    ``read`` or ``delete``; ``delete`` first takes the write lock on event_journal, so a move's
    drain of writers in progress (which lists that lock) sees the deleting transaction. Each
    query of a plpgsql function takes its own snapshot, after the statement's lock: a writer
    that the drain does not list reads a state the move committed before it listed."""
    fn = _function(schema)
    ej, _ = insert_trigger.table_and_function(schema, TRIGGER)
    parts = f'"{schema}".slice_partition'
    return f"""
CREATE OR REPLACE FUNCTION {fn}(writer_epoch bigint, slices int[], mode text)
RETURNS timestamptz LANGUAGE plpgsql VOLATILE AS $check$
DECLARE
  r record;
  lift timestamptz;
BEGIN
  IF mode = 'delete' THEN
    LOCK TABLE {ej} IN ROW EXCLUSIVE MODE;
  END IF;
  IF NOT EXISTS (SELECT 1 FROM {parts}) THEN
    RETURN clock_timestamp();
  END IF;
  FOR r IN
    SELECT DISTINCT p.min_slice, p.max_slice, p.state, p.epoch, p.location,
           CASE WHEN p.min_slice IS NULL THEN s.slice END AS lone
      FROM unnest(slices) AS s(slice)
      LEFT JOIN {parts} p ON s.slice BETWEEN p.min_slice AND p.max_slice
     WHERE p.min_slice IS NULL OR p.epoch > writer_epoch OR NOT (
           p.state = 'owned' OR (p.state = 'moving' AND mode <> 'delete') OR (p.state = 'fenced' AND mode = 'read'))
  LOOP
    IF r.min_slice IS NOT NULL AND r.epoch <= writer_epoch AND r.state = 'fenced' AND mode = 'write'
       AND pg_try_advisory_xact_lock_shared({fence_key(schema)}, r.min_slice) THEN
      CONTINUE;  -- the move holding the fence is gone: the fence has lapsed
    END IF;
    RAISE EXCEPTION USING
      ERRCODE = CASE WHEN r.min_slice IS NOT NULL AND r.epoch <= writer_epoch AND r.state IN ('moving', 'fenced')
                     THEN 'SJ025' ELSE 'SJ026' END,
      MESSAGE = format('slices %s-%s are %s here (map epoch %s, the writer''s %s)',
                       coalesce(r.min_slice, r.lone), coalesce(r.max_slice, r.lone),
                       coalesce(r.state, 'not served'), coalesce(r.epoch, 0), writer_epoch),
      DETAIL = json_build_object('min_slice', coalesce(r.min_slice, r.lone),
                                 'max_slice', coalesce(r.max_slice, r.lone), 'state', r.state,
                                 'epoch', r.epoch, 'location', r.location)::text;
  END LOOP;
  IF mode = 'write' THEN
    SELECT max(p.floor) INTO lift FROM {parts} p
     WHERE p.floor IS NOT NULL AND EXISTS (SELECT 1 FROM unnest(slices) s WHERE s BETWEEN p.min_slice AND p.max_slice);
    RETURN GREATEST(clock_timestamp(), lift);
  END IF;
  RETURN clock_timestamp();
END
$check$;
"""


def drop_check_function_sql(schema: str) -> str:
    return f"DROP FUNCTION IF EXISTS {_function(schema)}(bigint, int[], text);\n"


def stamp(prev: str, n: str) -> str:
    """The db_timestamp of the ``n``-th row (1-based) of a statement whose pid's (or pids')
    newest stored timestamp is ``prev`` (NULL: none). Needs :func:`clock` in the statement."""
    return f"GREATEST((SELECT t FROM clock), {prev} + {MICROSECOND}) + ({n} - 1) * {MICROSECOND}"


def settle(inserted: str) -> str:
    """A select-list expression (true) that waits, if it must, until the clock has passed the
    last per-row step of the rows of the data-modifying CTE ``inserted`` (it needs a RETURNING).
    Reading that CTE makes it run after the rows are inserted; it then costs one clock reading,
    since inserting a row takes longer than a microsecond."""
    last = f"(SELECT t FROM clock) + ((SELECT count(*) FROM {inserted}) - 1) * {MICROSECOND}"
    return f"(SELECT true FROM pg_sleep(GREATEST(0, extract(epoch FROM {last} - clock_timestamp()))))"


_RAISE = """\
  NEW.db_timestamp := GREATEST(NEW.db_timestamp, clock_timestamp());
  RETURN NEW;"""


def install_sql(schema: str) -> str:
    return insert_trigger.install_sql(schema, TRIGGER, _RAISE, WRITER_SETTING, WRITER_VALUE) + foreign_tags_sql(schema)


def remove_sql(schema: str) -> str:
    table, _ = insert_trigger.table_and_function(schema, TRIGGER)
    tags = f'"{schema}".{TAGS_TRIGGER}'
    return (
        insert_trigger.remove_sql(schema, TRIGGER)
        + f"DROP TRIGGER IF EXISTS {TAGS_TRIGGER} ON {table};\nDROP FUNCTION IF EXISTS {tags}();\n"
    )


TAGS_TRIGGER = "slice_journal_foreign_tags"
"""The trigger that writes the tag view rows of a foreign writer's tagged events."""


def foreign_tags_sql(schema: str) -> str:
    """An AFTER INSERT statement trigger on event_journal: the tag rows of the tagged events that
    a writer other than this library inserted (an Akka Persistence R2DBC service stores ``tags``
    on its event rows and has no tag view), in its transaction, numbered and bucketed as this
    library's write statement does (:meth:`.tag_statements.TagStatements.insert_from_events`),
    so ``events_by_tag`` sees them. This library's own writes (``slice_journal.writer`` set)
    write their tag rows themselves and are skipped; a tag already in the view for the event is
    left out, so nothing is numbered twice."""
    from ..buckets import BUCKET_MILLIS
    from .tag_statements import TagStatements

    table, _ = insert_trigger.table_and_function(schema, TAGS_TRIGGER)
    tags = TagStatements(schema)
    function = f'"{schema}".{TAGS_TRIGGER}'
    sizes = " ".join(f"WHEN '{k}' THEN {v}" for k, v in BUCKET_MILLIS.items())
    bucket = f"(SELECT CASE value {sizes} END FROM \"{schema}\".tag_view_settings WHERE name = 'bucket_size')"
    src = (
        "(SELECT n.persistence_id, n.seq_nr, n.db_timestamp, n.event_ser_id AS ser_id, "
        "n.event_ser_manifest AS ser_manifest, n.event_payload AS payload, n.meta_ser_id, n.meta_ser_manifest, "
        f"n.meta_payload, ARRAY(SELECT t FROM unnest(n.tags) t WHERE NOT EXISTS (SELECT 1 FROM {tags.t('tag_views')} v "
        "WHERE v.tag_name = t AND v.persistence_id = n.persistence_id AND v.sequence_nr = n.seq_nr)) AS tags "
        "FROM sj_new n WHERE n.tags IS NOT NULL AND NOT n.deleted)"
    )
    insert = tags.insert_from_events(src, "'foreign'", f"COALESCE({bucket}, 3600000)", "ON CONFLICT DO NOTHING")
    return f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $tags$
DECLARE
  n bigint;
BEGIN
  IF current_setting('{WRITER_SETTING}', true) IS DISTINCT FROM '{WRITER_VALUE}' THEN
    WITH tv AS ({insert}
    ) SELECT count(*) INTO n FROM tv;
  END IF;
  RETURN NULL;
END
$tags$;
DROP TRIGGER IF EXISTS {TAGS_TRIGGER} ON {table};
CREATE TRIGGER {TAGS_TRIGGER} AFTER INSERT ON {table} REFERENCING NEW TABLE AS sj_new
  FOR EACH STATEMENT EXECUTE FUNCTION {function}();
"""


INSTALLED_SQL = insert_trigger.INSTALLED_SQL
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
    table, _ = insert_trigger.table_and_function(schema, TRIGGER)
    return bool(await conn.fetchval(INSTALLED_SQL, table, TRIGGER))
