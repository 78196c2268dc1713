"""The SQL text of the Spark pipelines, in one place.

Spark's JDBC source takes partition predicates as SQL text (it has no parameters), so the
values in them are validated first and quoted here, once: entity types as string literals,
timestamps as ISO-8601 ``timestamptz`` literals, slices as ints. The read-model swap runs
through asyncpg with identifiers validated and quoted, values as parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from journal.errors import InvalidArgument
from journal.ids import validate_entity_type, validate_slice_range
from journal.settings import validate_identifier


def literal(value: str) -> str:
    """A SQL string literal (standard_conforming_strings: only ``'`` needs doubling)."""
    if "\x00" in value:
        raise InvalidArgument("NUL is not allowed in a SQL literal")
    return "'" + value.replace("'", "''") + "'"


def timestamp_literal(ts: datetime) -> str:
    if ts.tzinfo is None:
        raise InvalidArgument(f"timestamps must be timezone-aware, got {ts!r}")
    return f"'{ts.astimezone(UTC).isoformat()}'::timestamptz"


def slice_predicate(
    entity_type: str,
    min_slice: int,
    max_slice: int,
    from_timestamp: datetime | None = None,
    to_timestamp: datetime | None = None,
    *,
    include_deleted: bool = False,
) -> str:
    """``entity_type = 'T' AND slice BETWEEN a AND b [AND db_timestamp >= f AND db_timestamp < t]``.

    The window is half-open: ``from`` included, ``to`` excluded, so consecutive windows never
    read a row twice.
    """
    validate_entity_type(entity_type)
    validate_slice_range(min_slice, max_slice)
    parts = [f"entity_type = {literal(entity_type)}", f"slice BETWEEN {min_slice} AND {max_slice}"]
    if from_timestamp is not None:
        parts.append(f"db_timestamp >= {timestamp_literal(from_timestamp)}")
    if to_timestamp is not None:
        parts.append(f"db_timestamp < {timestamp_literal(to_timestamp)}")
    if not include_deleted:
        parts.append("NOT deleted")
    return " AND ".join(parts)


def state_predicate(entity_type: str, min_slice: int, max_slice: int, *, include_deleted: bool = False) -> str:
    """``entity_type = 'T' AND slice BETWEEN a AND b [AND state_ser_id <> 0]`` over
    ``durable_state`` (serializer id 0: a tombstone, the state deleted)."""
    validate_entity_type(entity_type)
    validate_slice_range(min_slice, max_slice)
    parts = [f"entity_type = {literal(entity_type)}", f"slice BETWEEN {min_slice} AND {max_slice}"]
    if not include_deleted:
        parts.append("state_ser_id <> 0")
    return " AND ".join(parts)


def ident(name: str, what: str = "identifier") -> str:
    return f'"{validate_identifier(name, what)}"'


def qualified(schema: str, table: str) -> str:
    return f"{ident(schema, 'schema')}.{ident(table, 'table')}"


def replace_from_staging(schema: str, target: str, staging: str, columns: Sequence[str]) -> list[str]:
    """Statements that make ``target`` hold exactly the staging rows (run in one transaction)."""
    cols = ", ".join(ident(c, "column") for c in columns)
    t, s = qualified(schema, target), qualified(schema, staging)
    return [
        f"LOCK TABLE {t} IN ACCESS EXCLUSIVE MODE",
        f"DELETE FROM {t}",
        f"INSERT INTO {t} ({cols}) SELECT {cols} FROM {s}",
    ]


def merge_from_staging(schema: str, target: str, staging: str, columns: Sequence[str], key: Sequence[str]) -> list[str]:
    """Statements that upsert the staging rows into ``target`` by ``key`` (one transaction)."""
    cols = ", ".join(ident(c, "column") for c in columns)
    keys = ", ".join(ident(c, "column") for c in key)
    rest = [c for c in columns if c not in key]
    action = "DO UPDATE SET " + ", ".join(f"{ident(c)} = EXCLUDED.{ident(c)}" for c in rest) if rest else "DO NOTHING"
    t, s = qualified(schema, target), qualified(schema, staging)
    return [f"INSERT INTO {t} ({cols}) SELECT {cols} FROM {s} ON CONFLICT ({keys}) {action}"]


def create_like(schema: str, target: str, staging: str, key: Sequence[str]) -> str:
    """Create a missing target with the staging table's columns and ``key`` as primary key."""
    keys = ", ".join(ident(c, "column") for c in key)
    pk = f", PRIMARY KEY ({keys})" if key else ""
    t, s = qualified(schema, target), qualified(schema, staging)
    return f"CREATE TABLE IF NOT EXISTS {t} (LIKE {s}{pk})"


def count_rows(schema: str, table: str) -> str:
    return f"SELECT count(*) FROM {qualified(schema, table)}"


def drop_table(schema: str, table: str) -> str:
    return f"DROP TABLE IF EXISTS {qualified(schema, table)}"


TABLE_EXISTS = "SELECT to_regclass($1) IS NOT NULL"
STAGING_TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = $1 AND tablename LIKE $2"
