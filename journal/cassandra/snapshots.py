"""Snapshots on Cassandra: the latest one per persistence id (older ones deleted on save)."""

from __future__ import annotations

import time

from ..backend import SnapshotRow
from ..ids import entity_type_of, slice_for
from ..serialization import Serialized
from .connections import CassandraPart
from .reads import meta_of


class CassandraSnapshots(CassandraPart):
    async def save_snapshot(self, row: SnapshotRow) -> None:
        m = row.meta
        await self.run("delete_snapshots", row.persistence_id)
        await self.run(
            "insert_snapshot", row.persistence_id, row.seq_nr, row.write_timestamp, row.state.ser_id,
            row.state.manifest, row.state.payload, m.ser_id if m else None, m.manifest if m else None,
            m.payload if m else None,
        )  # fmt: skip

    async def load_snapshot(self, persistence_id: str) -> SnapshotRow | None:
        rows = await self.run("load_snapshot", persistence_id)
        if not rows:
            return None
        r = rows[0]
        meta = meta_of(r)
        return SnapshotRow(
            persistence_id=persistence_id, entity_type=entity_type_of(persistence_id), slice=slice_for(persistence_id),
            seq_nr=r.sequence_nr, write_timestamp=r.timestamp or int(time.time() * 1000),
            state=Serialized(r.ser_id, r.ser_manifest, bytes(r.snapshot_data)), meta=meta,
        )  # fmt: skip

    async def delete_snapshot(self, persistence_id: str) -> None:
        await self.run("delete_snapshots", persistence_id)
