"""What the Cassandra backend reports about its keyspace (``info()``)."""

from __future__ import annotations

from typing import Any

from ..backend import ManifestCount
from .reads import CassandraReads


class CassandraInfo(CassandraReads):
    async def info(self) -> dict[str, Any]:
        """The nodes' releases, the keyspace, and the stored events per entity type (a scan of
        every persistence id: a tool's call, not a hot path)."""
        events: dict[str, int] = {}
        for pid in await self.persistence_ids(None, None, 2**31):
            if "|" not in pid:
                continue
            n = await self.highest_seq_nr(pid) - await self.deleted_to(pid)
            if n > 0:
                et = pid.split("|", 1)[0]
                events[et] = events.get(et, 0) + n
        return {
            "server_version": ", ".join(self.conns.release_versions()),
            "keyspace": self.keyspace,
            "events": dict(sorted(events.items())),
        }

    async def manifests(self) -> list[ManifestCount]:
        """A scan of the messages and snapshots tables, counted here (a tool's call)."""
        counts: dict[tuple[str, int, str], int] = {}
        for kind, statement in (("event", "all_manifests"), ("snapshot", "all_snapshot_manifests")):
            for r in await self.run(statement):
                if r.ser_id is not None:  # a partition's static row carries no event
                    key = (kind, int(r.ser_id), r.ser_manifest or "")
                    counts[key] = counts.get(key, 0) + 1
        return [ManifestCount(k, i, m, n) for (k, i, m), n in sorted(counts.items())]
