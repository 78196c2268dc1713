"""Snapshots on PostgreSQL: one row per persistence id, replaced on save."""

from __future__ import annotations

from ..backend import SnapshotRow
from ..serialization import Serialized
from .connections import PostgresPart


class PostgresSnapshots(PostgresPart):
    async def save_snapshot(self, row: SnapshotRow) -> None:
        m = row.meta
        await self.conns.execute(
            "save snapshot", self.sql.upsert_snapshot,
            row.slice, row.entity_type, row.persistence_id, row.seq_nr, row.write_timestamp,
            row.state.ser_id, row.state.manifest, row.state.payload, list(row.tags) or None,
            m.ser_id if m else None, m.manifest if m else None, m.payload if m else None,
        )  # fmt: skip

    async def load_snapshot(self, persistence_id: str) -> SnapshotRow | None:
        rows = await self.conns.fetch("load snapshot", self.sql.load_snapshot, persistence_id)
        if not rows:
            return None
        r = rows[0]
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

    async def delete_snapshot(self, persistence_id: str) -> None:
        await self.conns.execute("delete snapshot", self.sql.delete_snapshot, persistence_id)
