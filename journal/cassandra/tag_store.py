"""The tag view store on Cassandra (tag_views, tag_write_progress, tag_scanning;
:class:`journal.backend.TagStore`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

from ..backend import TaggedEvent, TagPageRow, TagProgress, TagRow
from ..errors import ConfigurationError
from ..serialization import Serialized
from ..timeuuid import GREGORIAN_OFFSET
from .connections import CassandraConnections, execute
from .reads import CassandraReads, meta_of

SETTINGS_PID = "__slice_journal_settings__"
"""The bucket size is kept in ``metadata.properties`` of this reserved row (reference tables only)."""


def _bound(t: int) -> uuid.UUID:
    """The lowest TimeUUID at 100-ns time ``t`` *as Cassandra compares them*: time first, then the
    clock-sequence and node bytes as signed bytes, so 0x80 in every byte is the least (the
    driver's ``cassandra.util.min_uuid_from_time`` and CQL ``minTimeuuid`` use the same bytes).
    ``timestamp > _bound(t)`` therefore keeps every real row at time ``t`` and ``timestamp <
    _bound(t)`` keeps only rows strictly before ``t``."""
    return uuid.UUID(fields=(t & 0xFFFFFFFF, (t >> 32) & 0xFFFF, ((t >> 48) & 0x0FFF) | 0x1000, 0x80, 0x80,
                             0x808080808080))  # fmt: skip


def lower_bound(bucket_millis: int) -> uuid.UUID:
    """Exclusive lower bound that keeps every row of a bucket starting at ``bucket_millis``."""
    return _bound(bucket_millis * 10_000 + GREGORIAN_OFFSET)


def upper_bound(before_ticks: int) -> uuid.UUID:
    """Exclusive upper bound: rows whose time is strictly below ``before_ticks``."""
    return _bound(before_ticks)


class CassandraTagStore:
    """``reads``: the backend's reads by pid (a pid's tagged events are its messages rows)."""

    def __init__(self, conns: CassandraConnections, reads: CassandraReads) -> None:
        self.conns = conns
        self.reads = reads

    async def write_tag_rows(self, rows: Sequence[TagRow]) -> None:
        """One unlogged batch per (tag, bucket) partition: an idempotent upsert."""
        from cassandra.query import BatchStatement, BatchType

        batch = BatchStatement(batch_type=BatchType.UNLOGGED, consistency_level=self.conns.write_cl)
        for r in rows:
            m = r.meta
            batch.add(self.conns.prepared["insert_tag_view"], (
                r.tag, r.timebucket, r.timeuuid, r.persistence_id, r.tag_pid_seq_nr, r.seq_nr, r.writer,
                r.event.ser_id, r.event.manifest, r.event.payload, m.ser_id if m else None,
                m.manifest if m else None, m.payload if m else None,
            ))  # fmt: skip
        await execute(self.conns.session, batch)

    async def write_progress(self, progress: Sequence[TagProgress]) -> None:
        """One row per pid, each its own partition: written concurrently (a batch's pids at once),
        not one round trip after another."""
        await asyncio.gather(*(
            self.conns.run("write_progress", p.persistence_id, p.tag, p.seq_nr, p.tag_pid_seq_nr, p.offset)
            for p in progress
        ))  # fmt: skip

    async def read_progress(self, persistence_id: str) -> dict[str, TagProgress]:
        rows = await self.conns.run("read_progress", persistence_id)
        return {
            r.tag: TagProgress(r.persistence_id, r.tag, r.sequence_nr, r.tag_pid_sequence_nr, r.offset) for r in rows
        }

    async def read_scanning(self, persistence_id: str) -> int:
        rows = await self.conns.run("read_scanning", persistence_id)
        return int(rows[0].sequence_nr) if rows else 0

    async def write_scanning(self, persistence_id: str, seq_nr: int) -> None:
        await self.conns.run("write_scanning", persistence_id, seq_nr)

    async def tagged_events(self, persistence_id: str, from_seq_nr: int, limit: int) -> list[TaggedEvent]:
        rows = await self.reads.read_rows(persistence_id, from_seq_nr, 2**63 - 1, limit)
        return [
            TaggedEvent(x.persistence_id, x.sequence_nr, x.timestamp, tuple(sorted(x.tags or ())),
                        Serialized(x.ser_id, x.ser_manifest, bytes(x.event)), x.writer_uuid, meta_of(x))
            for x in rows
        ]  # fmt: skip

    async def read_tag_rows(
        self, tag: str, bucket: int, after: uuid.UUID | None, before_ticks: int, limit: int
    ) -> list[TagPageRow]:
        """The driver's rows as they come (selected under the names of the page's columns), each
        given the one-tag ``tags`` the partition holds."""
        lower = after if after is not None else lower_bound(bucket)
        rows = await self.conns.run_for_dicts("read_tag_views", tag, bucket, lower, upper_bound(before_ticks), limit)
        tags = (tag,)
        for r in rows:
            r["tags"] = tags
        return rows  # type: ignore[return-value]

    async def next_bucket(self, tag: str, from_bucket: int, to_bucket: int) -> int | None:
        """Cassandra cannot list a tag's buckets: every bucket is read (set first_time_bucket)."""
        return from_bucket

    async def ensure_bucket_size(self, size: str) -> None:
        rows = await self.conns.run("read_properties", SETTINGS_PID)
        stored = (rows[0].properties or {}).get("tag_bucket_size") if rows else None
        if stored == size:
            return
        if stored is not None and await self.conns.run("any_tag_view"):
            raise ConfigurationError(
                f"tag bucket size is {stored!r} in this keyspace and tagged data exists; it cannot change to {size!r}"
            )
        await self.conns.run("write_property", "tag_bucket_size", size, SETTINGS_PID)
