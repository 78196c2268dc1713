"""The cleanup tool's deletions on Cassandra (:class:`journal.backend.CleanupStore`).

A pid's tag rows live in other partitions (``(tag_name, timebucket)``), so they are found
through its events in ``messages`` (tags, timeuuid): :meth:`delete_tag_rows` must run before
the events are deleted, as :class:`journal.cleanup.Cleanup` does. Tag rows of events deleted
earlier (``delete_events_to``) cannot be found this way (the reference has the same limit).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ..backend import PidFootprint, TagProgress
from ..buckets import bucket_of
from .connections import CassandraConnections, execute
from .cql import statements
from .snapshots import CassandraSnapshots
from .tag_store import CassandraTagStore
from .writes import CassandraWrites

PAGE = 1000
"""Events read per page while walking a pid's events."""
PARALLEL = 32
"""Tag row statements in flight at once."""


class CassandraCleanup:
    """Over the backend's writes (its deletes and write state), snapshots and tag store."""

    def __init__(
        self,
        conns: CassandraConnections,
        events: CassandraWrites,
        snapshots: CassandraSnapshots,
        tags: CassandraTagStore,
    ) -> None:
        self.conns = conns
        self.b = events
        self._snapshots = snapshots
        self._tags = tags
        self._prepared: dict[str, Any] = {}

    async def _run(self, name: str, *params: Any) -> list[Any]:
        if not self._prepared:  # the backend's read and write consistency levels
            read_cl = self.conns.prepared["read_messages"].consistency_level
            write_cl = self.conns.prepared["delete_messages"].consistency_level
            for key, text in statements(self.conns.keyspace, "cleanup.cql").items():
                stmt = await asyncio.to_thread(self.conns.session.prepare, text)
                stmt.consistency_level = read_cl if text.startswith("SELECT") else write_cl
                self._prepared[key] = stmt
        return await execute(self.conns.session, self._prepared[name], params)

    async def _events(self, pid: str) -> AsyncIterator[Any]:
        """The pid's stored events (sequence_nr, timestamp, tags, ...), page by page."""
        nxt = 1
        while True:
            rows = await self.b.read_rows(pid, nxt, 2**63 - 1, PAGE)
            for r in rows:
                yield r
            if len(rows) < PAGE:
                return
            nxt = int(rows[-1].sequence_nr) + 1

    async def _tag_keys(self, pid: str) -> list[tuple[str, int, Any, str]]:
        size = self.conns.settings.tags.bucket_size
        return [
            (tag, bucket_of(r.timestamp, size), r.timestamp, pid)
            async for r in self._events(pid)
            for tag in sorted(r.tags or ())
        ]

    async def _each(self, name: str, keys: list[tuple[str, int, Any, str]]) -> list[list[Any]]:
        out: list[list[Any]] = []
        for i in range(0, len(keys), PARALLEL):
            out.extend(await asyncio.gather(*(self._run(name, *k) for k in keys[i : i + PARALLEL])))
        return out

    async def footprint(self, persistence_id: str) -> PidFootprint:
        events = [r async for r in self._events(persistence_id)]
        found = await self._each("read_tag_row", await self._tag_keys(persistence_id)) if events else []
        snap = await self._snapshots.load_snapshot(persistence_id)
        return PidFootprint(
            persistence_id, len(events), await self.b.highest_seq_nr(persistence_id),
            None if snap is None else snap.seq_nr, sum(len(rows) for rows in found),
            int(events[0].sequence_nr) if events else None,
        )  # fmt: skip

    async def delete_tag_rows(self, persistence_id: str, *, keep_numbering: bool) -> None:
        """With ``keep_numbering`` the pid's progress is first raised to the rows about to be
        deleted (the tag writer's recovery continues from it), then the rows go."""
        keys = await self._tag_keys(persistence_id)
        if keep_numbering:
            await self._raise_progress(persistence_id, keys)
        await self._each("delete_tag_row", keys)
        if not keep_numbering:
            await self._run("delete_tag_progress", persistence_id)
            await self._run("delete_tag_scanning", persistence_id)

    async def _raise_progress(self, pid: str, keys: list[tuple[str, int, Any, str]]) -> None:
        top: dict[str, TagProgress] = {}
        for (tag, _, stamp, _), rows in zip(keys, await self._each("read_tag_row", keys), strict=True):
            for r in rows:
                if tag not in top or r.tag_pid_sequence_nr > top[tag].tag_pid_seq_nr:
                    top[tag] = TagProgress(pid, tag, int(r.sequence_nr), int(r.tag_pid_sequence_nr), stamp)
        stored = await self._tags.read_progress(pid)
        raised = [p for tag, p in top.items() if tag not in stored or p.tag_pid_seq_nr > stored[tag].tag_pid_seq_nr]
        if raised:
            await self._tags.write_progress(raised)

    async def delete_all_events(self, persistence_id: str, *, reset_seq_nr: bool) -> None:
        """``deleted_to`` is written first (the backend's delete), so a re-run after an
        interruption still knows the highest number. A reset then deletes the pid's partitions
        whole (static columns included) and forgets the pid."""
        highest = await self.b.highest_seq_nr(persistence_id)
        if highest > 0:
            await self.b.delete_events_to(persistence_id, highest)
        if reset_seq_nr:
            for p in self.b.layout.delete_partitions(1, max(highest, 1)):  # every partition that may hold one
                await self._run("delete_partition", persistence_id, p)
            await self._run("delete_metadata", persistence_id)
            await self._run("delete_persistence_id", persistence_id)
            self.b.forget(persistence_id)
