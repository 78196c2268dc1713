"""Snapshots on PostgreSQL: the newest per persistence id in ``snapshot`` (one row per pid, as
the reference DDL), older ones kept on request in ``snapshot_older``."""

from __future__ import annotations

from typing import Any

import asyncpg

from ..backend import SnapshotRow
from ..serialization import Serialized
from .connections import PostgresPart


class PostgresSnapshots(PostgresPart):
    async def save_snapshot(self, row: SnapshotRow, keep: int = 1) -> None:
        m = row.meta
        args = (
            row.slice, row.entity_type, row.persistence_id, row.seq_nr, row.write_timestamp,
            row.state.ser_id, row.state.manifest, row.state.payload, list(row.tags) or None,
            m.ser_id if m else None, m.manifest if m else None, m.payload if m else None,
        )  # fmt: skip
        if keep <= 1:
            await self.conns.execute("save snapshot", self.sql.replace_snapshot, *args)
            return
        pid, seq = row.persistence_id, row.seq_nr

        async def save(conn: Any) -> None:
            async with conn.transaction():
                await conn.execute(self.sql.keep_previous_snapshot, pid, seq)
                await conn.execute(self.sql.upsert_snapshot, *args)
                await conn.execute(self.sql.prune_older_snapshots, pid, seq, keep - 1)

        await self.conns.run("save snapshot", save)

    async def load_snapshot(self, persistence_id: str) -> SnapshotRow | None:
        rows = await self.conns.fetch("load snapshot", self.sql.load_snapshot, persistence_id)
        return snapshot_row(rows[0]) if rows else None

    async def load_snapshots(self, persistence_id: str, limit: int) -> list[SnapshotRow]:
        newest = await self.load_snapshot(persistence_id)
        if newest is None or limit <= 1:
            return [newest] if newest is not None else []
        rows = await self.conns.fetch("load older snapshots", self.sql.load_older_snapshots, persistence_id, limit - 1)
        return [newest, *(snapshot_row(r) for r in rows if r["seq_nr"] < newest.seq_nr)]

    async def delete_snapshot(self, persistence_id: str) -> None:
        async def delete(conn: Any) -> None:
            async with conn.transaction():
                await conn.execute(self.sql.delete_pid("snapshot"), persistence_id)
                await conn.execute(self.sql.delete_pid("snapshot_older"), persistence_id)

        await self.conns.run("delete snapshot", delete)


def snapshot_row(r: asyncpg.Record) -> SnapshotRow:
    meta = None
    if r["meta_ser_id"] is not None:
        meta = Serialized(r["meta_ser_id"], r["meta_ser_manifest"] or "", bytes(r["meta_payload"] or b""))
    return SnapshotRow(
        persistence_id=r["persistence_id"],
        entity_type=r["entity_type"],
        slice=r["slice"],
        seq_nr=r["seq_nr"],
        write_timestamp=r["write_timestamp"],
        state=Serialized(r["ser_id"], r["ser_manifest"], bytes(r["snapshot"])),
        tags=tuple(r["tags"] or ()),
        meta=meta,
        db_timestamp=r["db_timestamp"],
    )
