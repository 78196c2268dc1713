"""Handlers of the projection-version tests (imported by worker processes by path): two versions
of one read model, per persistence id, in the table ``t_<entity type>`` of the version's schema
(the handler's transaction runs with the version's search_path: unqualified names are its)."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from journal import EventEnvelope


def table_of(entity_type: str) -> str:
    return f"t_{entity_type.lower()}"


async def totals_v1(conn: asyncpg.Connection, envelopes: Sequence[EventEnvelope]) -> None:
    """Version 1: events per pid."""
    table = table_of(envelopes[0].entity_type)
    await conn.execute(f"CREATE TABLE IF NOT EXISTS {table} (pid text PRIMARY KEY, events int NOT NULL)")
    await conn.executemany(
        f"INSERT INTO {table} VALUES ($1, 1) ON CONFLICT (pid) DO UPDATE SET events = {table}.events + 1",
        [(e.persistence_id,) for e in envelopes],
    )


async def totals_v2(conn: asyncpg.Connection, envelopes: Sequence[EventEnvelope]) -> None:
    """Version 2: another shape (a column more): events and the last seq_nr per pid."""
    table = table_of(envelopes[0].entity_type)
    await conn.execute(
        f"CREATE TABLE IF NOT EXISTS {table} (pid text PRIMARY KEY, events int NOT NULL, last_seq_nr bigint NOT NULL)"
    )
    await conn.executemany(
        f"""INSERT INTO {table} VALUES ($1, 1, $2) ON CONFLICT (pid)
DO UPDATE SET events = {table}.events + 1, last_seq_nr = greatest({table}.last_seq_nr, $2)""",
        [(e.persistence_id, e.seq_nr) for e in envelopes],
    )
