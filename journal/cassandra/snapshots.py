"""Snapshots on Cassandra: a row per snapshot (``snapshots`` is clustered by sequence number,
newest first); a save keeps the newest ``keep`` and deletes the older ones."""

from __future__ import annotations

import time
from typing import Any

from ..backend import SnapshotRow
from ..ids import entity_type_of, slice_for
from ..serialization import Serialized
from .connections import CassandraPart
from .reads import meta_of


class CassandraSnapshots(CassandraPart):
    async def save_snapshot(self, row: SnapshotRow, keep: int = 1) -> None:
        if keep > 1:  # insert, then drop all but the newest ``keep``
            await self._insert_snapshot(row)
            seqs = [r.sequence_nr for r in await self.run("snapshot_seq_nrs", row.persistence_id)]
            seqs = sorted((s for s in seqs if s <= row.seq_nr), reverse=True)
            if len(seqs) > keep:
                await self.run("delete_snapshots_below", row.persistence_id, seqs[keep - 1])
            return
        await self.run("delete_snapshots", row.persistence_id)
        await self._insert_snapshot(row)

    async def _insert_snapshot(self, row: SnapshotRow) -> None:
        m = row.meta
        await self.run(
            "insert_snapshot", row.persistence_id, row.seq_nr, row.write_timestamp, row.state.ser_id,
            row.state.manifest, row.state.payload, m.ser_id if m else None, m.manifest if m else None,
            m.payload if m else None,
        )  # fmt: skip

    async def load_snapshot(self, persistence_id: str) -> SnapshotRow | None:
        rows = await self.run("load_snapshot", persistence_id)
        return _snapshot_row(persistence_id, rows[0]) if rows else None

    async def load_snapshots(self, persistence_id: str, limit: int) -> list[SnapshotRow]:
        rows = await self.run("load_snapshots", persistence_id)
        return [_snapshot_row(persistence_id, r) for r in list(rows)[:limit]]

    async def delete_snapshot(self, persistence_id: str) -> None:
        await self.run("delete_snapshots", persistence_id)


def _snapshot_row(persistence_id: str, r: Any) -> SnapshotRow:
    return SnapshotRow(
        persistence_id=persistence_id, entity_type=entity_type_of(persistence_id), slice=slice_for(persistence_id),
        seq_nr=r.sequence_nr, write_timestamp=r.timestamp or int(time.time() * 1000),
        state=Serialized(r.ser_id, r.ser_manifest, bytes(r.snapshot_data)), meta=meta_of(r),
    )  # fmt: skip
