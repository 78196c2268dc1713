"""Every SQL statement of projection versions (:mod:`projections.versions`): the version rows,
the catch-up check between two versions' offsets, the readers' views and a version's schema.

Identifiers (schemas, a version's tables) are quoted here; values are always parameters.
Functions take an asyncpg connection so callers choose the transaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import asyncpg

from journal.ids import NUMBER_OF_SLICES
from journal.postgres import SchemaSql


def quoted(identifier: str) -> str:
    """``identifier`` as a quoted SQL identifier (any characters; ``"`` doubled)."""
    return '"' + identifier.replace('"', '""') + '"'


RELATION_KINDS = ["r", "p", "v", "m"]
"""What a version's schema holds that readers see through a view: tables, partitioned tables,
views, materialized views (not its sequences or indexes)."""


@dataclass(frozen=True)
class VersionSql(SchemaSql):
    """Statements for one journal schema, which is also the readers' schema (their views)."""

    async def register(self, conn: Any, name: str, version: int, entity_type: str, tables_schema: str) -> Any:
        """The version's row (created ``building`` if new) and its schema (created if missing).
        Takes no lock: a worker starting while a switch holds the rows is not held up by it."""
        await conn.execute(
            f"""INSERT INTO {self.t("projection_version")}
  (projection_name, version, entity_type, tables_schema, state, created_at)
VALUES ($1, $2, $3, $4, 'building', clock_timestamp()) ON CONFLICT DO NOTHING""",
            name,
            version,
            entity_type,
            tables_schema,
        )
        row = await conn.fetchrow(
            f"SELECT * FROM {self.t('projection_version')} WHERE projection_name = $1 AND version = $2",
            name,
            version,
        )
        try:
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quoted(row['tables_schema'])}")
        except (asyncpg.UniqueViolationError, asyncpg.DuplicateSchemaError):
            pass  # two workers of the version starting at once: the other one created it
        return row

    async def state(self, conn: Any, name: str, version: int) -> str | None:
        """The version's state (None: no such version, or it was dropped)."""
        state: str | None = await conn.fetchval(
            f"SELECT state FROM {self.t('projection_version')} WHERE projection_name = $1 AND version = $2",
            name,
            version,
        )
        return state

    async def versions(self, conn: Any, name: str | None = None, *, lock: bool = False) -> list[Any]:
        """The version rows of ``name`` (all names: None), by name and version; ``lock``: FOR UPDATE."""
        return list(
            await conn.fetch(
                f"""SELECT * FROM {self.t("projection_version")} WHERE $1::text IS NULL OR projection_name = $1
ORDER BY projection_name, version{" FOR UPDATE" if lock else ""}""",
                name,
            )
        )

    async def hold_commits(self, conn: Any, versioned_name: str) -> None:
        """Inside a transaction: lock the lease rows of ``versioned_name`` FOR UPDATE, so its
        workers' offset transactions (which lock them FOR SHARE first) wait until it ends."""
        await conn.execute(
            f"""SELECT slice FROM {self.t("projection_slice_lease")} WHERE projection_name = $1
ORDER BY slice FOR UPDATE""",
            versioned_name,
        )

    async def behind(self, conn: Any, new: str, old: str) -> int:
        """How many persistence ids ``old`` has processed further than ``new``: per slice and pid
        ``old``'s latest stored seq_nr, not reached by ``new``'s rows of that pid nor covered by
        a later slice offset of ``new`` (0: ``new`` has everything ``old`` has)."""
        store = self.t("projection_timestamp_offset_store")
        n: int = await conn.fetchval(
            f"""SELECT count(*) FROM (
  SELECT slice, persistence_id, max(seq_nr) AS seq_nr, max(timestamp_offset) AS ts FROM {store}
  WHERE slice = ANY($3::int[]) AND projection_name = $2 AND persistence_id <> '' GROUP BY slice, persistence_id
) o
WHERE NOT EXISTS (SELECT 1 FROM {store} v WHERE v.slice = o.slice AND v.projection_name = $1
    AND v.persistence_id = o.persistence_id AND v.seq_nr >= o.seq_nr)
  AND NOT EXISTS (SELECT 1 FROM {store} v WHERE v.slice = o.slice AND v.projection_name = $1
    AND v.timestamp_offset > o.ts)""",
            new,
            old,
            list(range(NUMBER_OF_SLICES)),
        )
        return n

    async def relations(self, conn: Any, schema: str) -> list[str]:
        """The tables and views of ``schema``, by name."""
        rows = await conn.fetch(
            """SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind::text = ANY($2::text[]) ORDER BY 1""",
            schema,
            RELATION_KINDS,
        )
        return [r[0] for r in rows]

    async def views_over(self, conn: Any, schemas: list[str]) -> list[str]:
        """The views of the readers' schema that read a relation of one of ``schemas``."""
        rows = await conn.fetch(
            """SELECT DISTINCT v.relname FROM pg_class v
JOIN pg_namespace vn ON vn.oid = v.relnamespace
JOIN pg_rewrite r ON r.ev_class = v.oid
JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid AND d.refclassid = 'pg_class'::regclass
JOIN pg_class t ON t.oid = d.refobjid
JOIN pg_namespace tn ON tn.oid = t.relnamespace
WHERE vn.nspname = $1 AND v.relkind = 'v' AND tn.nspname = ANY($2::text[]) ORDER BY 1""",
            self.schema,
            schemas,
        )
        return [r[0] for r in rows]

    async def drop_view(self, conn: Any, view: str) -> None:
        await conn.execute(f"DROP VIEW {quoted(self.schema)}.{quoted(view)}")

    async def create_view(self, conn: Any, view: str, tables_schema: str) -> None:
        """The readers' view ``view``: every row and column of the version's relation of that name."""
        await conn.execute(
            f"CREATE VIEW {quoted(self.schema)}.{quoted(view)} AS SELECT * FROM {quoted(tables_schema)}.{quoted(view)}"
        )

    async def set_serving(self, conn: Any, name: str, version: int) -> None:
        """``version`` serves, the one that served before is retired."""
        await conn.execute(
            f"""UPDATE {self.t("projection_version")}
SET state = CASE WHEN version = $2 THEN 'serving' ELSE 'retired' END,
    switched_at = CASE WHEN version = $2 THEN clock_timestamp() ELSE switched_at END
WHERE projection_name = $1 AND (version = $2 OR state = 'serving')""",
            name,
            version,
        )

    async def use_schema(self, conn: Any, tables_schema: str) -> None:
        """Inside a handler's transaction: its unqualified table names are the version's."""
        await conn.execute(f"SET LOCAL search_path TO {quoted(tables_schema)}")

    async def live_workers(self, conn: Any, versioned_name: str) -> int:
        """Workers of ``versioned_name`` running and not expired."""
        n: int = await conn.fetchval(
            f"""SELECT count(*) FROM {self.t("projection_worker")}
WHERE projection_name = $1 AND state = 'running' AND expires_at > clock_timestamp()""",
            versioned_name,
        )
        return n

    async def drop(self, conn: Any, name: str, version: int, versioned_name: str, tables_schema: str) -> None:
        """The version's schema (its tables), offsets, leases, workers, pauses, dead letters, parked events and row."""
        await conn.execute(f"DROP SCHEMA IF EXISTS {quoted(tables_schema)} CASCADE")
        for table in (
            "projection_timestamp_offset_store", "projection_slice_lease", "projection_worker",
            "projection_management", "projection_dead_letter", "projection_parked_event",
        ):  # fmt: skip
            await conn.execute(f"DELETE FROM {self.t(table)} WHERE projection_name = $1", versioned_name)
        await conn.execute(
            f"DELETE FROM {self.t('projection_version')} WHERE projection_name = $1 AND version = $2", name, version
        )
