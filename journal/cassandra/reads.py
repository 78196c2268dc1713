"""Reads by persistence id on Cassandra: partition after partition (:mod:`.partitions`), from the
first one ``deleted_to`` leaves."""

from __future__ import annotations

from typing import Any

from ..backend import StoredEvent
from ..ids import entity_type_of, slice_for
from ..serialization import Serialized
from ..timeuuid import datetime_of
from .connections import CassandraPart
from .partitions import PartitionCursor


class CassandraReads(CassandraPart):
    async def deleted_to(self, pid: str) -> int:
        rows = await self.run("read_deleted_to", pid)
        return int(rows[0].deleted_to or 0) if rows else 0

    async def highest_seq_nr(self, persistence_id: str) -> int:
        return (await self.highest_and_guard(persistence_id))[0]

    async def highest_and_guard(self, persistence_id: str) -> tuple[int, int | None]:
        """The highest stored number, and the static ``highest_sequence_nr`` of the partition the
        next call goes to (what the single-writer check expects to find unchanged). Partitions
        before the one of ``deleted_to + 1`` may be empty (deleted); the scan ends past the last
        partition that may hold ``highest + 1`` (:meth:`PartitionLayout.may_hold`)."""
        cursor = PartitionCursor(self.layout, await self.deleted_to(persistence_id) + 1)
        guards: dict[int, int | None] = {}
        while cursor.more():
            rows = await self.run("highest_in_partition", persistence_id, cursor.partition)
            guards[cursor.partition] = rows[0].highest_sequence_nr if rows else None
            cursor.advance(rows[0].sequence_nr if rows else None)
        highest = cursor.next_seq_nr - 1
        return highest, guards.get(self.layout.write_partition(highest + 1))

    async def read_events(self, persistence_id: str, from_seq_nr: int, to_seq_nr: int, limit: int) -> list[StoredEvent]:
        return [event_of(x) for x in await self.read_rows(persistence_id, from_seq_nr, to_seq_nr, limit)]

    async def read_rows(self, persistence_id: str, from_seq_nr: int, to_seq_nr: int, limit: int) -> list[Any]:
        """Raw messages rows (with their timeuuid), partition after partition, from the partition of
        ``from_seq_nr`` on while a partition may still hold the next number."""
        cursor = PartitionCursor(self.layout, max(from_seq_nr, await self.deleted_to(persistence_id) + 1))
        out: list[Any] = []
        while len(out) < limit and cursor.next_seq_nr <= to_seq_nr and cursor.more():
            rows = await self.run(
                "read_messages", persistence_id, cursor.partition, cursor.next_seq_nr, to_seq_nr, limit - len(out)
            )
            out.extend(rows)
            cursor.advance(int(rows[-1].sequence_nr) if rows else None)
        return out

    async def persistence_ids(self, entity_type: str | None, after: str | None, limit: int) -> list[str]:
        """A full scan of all_persistence_ids, sorted here (fine for tools, not a hot path)."""
        rows = await self.run("all_persistence_ids")
        ids = sorted(
            r.persistence_id for r in rows
            if (after is None or r.persistence_id > after)
            and (entity_type is None or (r.persistence_id.split("|", 1)[0] == entity_type and "|" in r.persistence_id))
        )  # fmt: skip
        return ids[:limit]


def meta_of(x: Any) -> Serialized | None:
    if x.meta_ser_id is None:
        return None
    return Serialized(x.meta_ser_id, x.meta_ser_manifest or "", bytes(x.meta or b""))


def event_of(x: Any) -> StoredEvent:
    meta = meta_of(x)
    return StoredEvent(
        persistence_id=x.persistence_id, entity_type=entity_type_of(x.persistence_id),
        slice=slice_for(x.persistence_id), seq_nr=x.sequence_nr, db_timestamp=datetime_of(x.timestamp),
        ser_id=x.ser_id, ser_manifest=x.ser_manifest, payload=bytes(x.event), writer=x.writer_uuid,
        tags=tuple(sorted(x.tags or ())), meta=meta,
    )  # fmt: skip
