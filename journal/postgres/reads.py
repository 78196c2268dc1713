"""Reads by persistence id on PostgreSQL (rows in the seam's :data:`~journal.backend.SLICE_ROW_COLUMNS`
layout, decoded by :func:`~journal.backend.stored_event`)."""

from __future__ import annotations

from datetime import datetime

from ..backend import StoredEvent, stored_event
from .connections import PostgresPart


class PostgresReads(PostgresPart):
    async def read_events(self, persistence_id: str, from_seq_nr: int, to_seq_nr: int, limit: int) -> list[StoredEvent]:
        rows = await self.conns.fetch(
            "read events", self.sql.events_by_pid, persistence_id, from_seq_nr, to_seq_nr, limit
        )
        return [stored_event(r) for r in rows]

    async def persistence_ids(self, entity_type: str | None, after: str | None, limit: int) -> list[str]:
        if entity_type is None:
            rows = await self.conns.fetch("persistence ids", self.sql.persistence_ids, after or "", limit)
        else:
            rows = await self.conns.fetch(
                "persistence ids", self.sql.persistence_ids_by_type, after or "", limit, entity_type
            )
        return [r[0] for r in rows]

    async def load_event(self, persistence_id: str, seq_nr: int) -> StoredEvent | None:
        rows = await self.conns.fetch("load event", self.sql.load_event, persistence_id, seq_nr)
        return stored_event(rows[0]) if rows else None

    async def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        value: datetime | None = await self.conns.fetchval(
            "timestamp of", self.sql.timestamp_of, persistence_id, seq_nr
        )
        return value
