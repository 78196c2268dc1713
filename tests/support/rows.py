"""Counting stored event rows straight from the table (what a write really left behind)."""

from __future__ import annotations

import asyncpg


async def count_rows(dsn: str, pid: str | None = None) -> int:
    """Rows in ``event_journal``, of one pid or of all."""
    conn = await asyncpg.connect(dsn)
    try:
        if pid is None:
            return int(await conn.fetchval("SELECT count(*) FROM event_journal"))
        return int(await conn.fetchval("SELECT count(*) FROM event_journal WHERE persistence_id = $1", pid))
    finally:
        await conn.close()
