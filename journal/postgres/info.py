"""What the Postgres backend reports about its database (``journal info``, the Spark CLI)."""

from __future__ import annotations

from typing import Any

import asyncpg

from ..backend import ManifestCount
from .connections import PostgresPart
from .state_statements import StateStatements


class PostgresInfo(PostgresPart):
    async def info(self) -> dict[str, Any]:
        """Server version, the schema's Alembic revision (None before migrations), the event
        count per entity type and the ``durable_state`` rows (``states``, of which
        ``tombstones``; None without the table)."""

        async def read(conn: Any) -> dict[str, Any]:
            version = await conn.fetchval(self.sql.server_version)
            counts = await conn.fetch(self.sql.event_counts)
            try:
                rev = await conn.fetchval(self.sql.schema_revision)
            except asyncpg.exceptions.UndefinedTableError:
                rev = None
            try:
                states = dict(await conn.fetchrow(StateStatements(self.settings.schema).counts))
            except asyncpg.exceptions.UndefinedTableError:  # before migration 0011
                states = None
            events = {r[0]: r[1] for r in counts}
            return {"server_version": version, "schema_revision": rev, "events": events, "durable_state": states}

        return await self.conns.run("info", read)

    async def manifests(self) -> list[ManifestCount]:
        rows = await self.conns.fetch("manifests", self.sql.manifest_counts)
        merged: dict[tuple[str, int, str], int] = {}
        for kind, ser_id, manifest, n in rows:  # snapshot and snapshot_older rows count together
            merged[(kind, ser_id, manifest)] = merged.get((kind, ser_id, manifest), 0) + n
        return [ManifestCount(k, i, m, n) for (k, i, m), n in merged.items()]
