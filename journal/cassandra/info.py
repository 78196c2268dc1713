"""What the Cassandra backend reports about its keyspace (``info()``)."""

from __future__ import annotations

from typing import Any

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
