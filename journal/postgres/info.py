"""What the Postgres backend reports about its database (``journal info``, the Spark CLI)."""

from __future__ import annotations

from typing import Any

import asyncpg

from .connections import PostgresPart


class PostgresInfo(PostgresPart):
    async def info(self) -> dict[str, Any]:
        """Server version, the schema's Alembic revision (None before migrations) and the event
        count per entity type."""

        async def read(conn: Any) -> dict[str, Any]:
            version = await conn.fetchval(self.sql.server_version)
            counts = await conn.fetch(self.sql.event_counts)
            try:
                rev = await conn.fetchval(self.sql.schema_revision)
            except asyncpg.exceptions.UndefinedTableError:
                rev = None
            return {"server_version": version, "schema_revision": rev, "events": {r[0]: r[1] for r in counts}}

        return await self.conns.run("info", read)
