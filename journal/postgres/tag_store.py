"""The tag view store on PostgreSQL (:class:`journal.backend.TagStore`).

The journal's own tagged writes put their tag rows in the events statement (same transaction),
so on PostgreSQL the tag writer is not needed for them; this store also serves the tag writer
(its recovery and idempotent resends) and every events-by-tag query.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from ..backend import TaggedEvent, TagPageRow, TagProgress, TagRow
from ..errors import ConfigurationError
from ..serialization import Serialized
from ..timeuuid import ticks, timeuuid_for_event
from .connections import PostgresConnections
from .tag_statements import TagStatements

_ZERO_UUID = uuid.UUID(int=0)


def _meta(ser_id: int | None, manifest: str | None, payload: bytes | None) -> Serialized | None:
    return None if ser_id is None else Serialized(ser_id, manifest or "", bytes(payload or b""))


class PostgresTagStore:
    def __init__(self, conns: PostgresConnections) -> None:
        self.conns = conns
        self.sql = TagStatements(conns.settings.schema)
        self._run = conns.run

    async def write_tag_rows(self, rows: Sequence[TagRow]) -> None:
        cols: list[list[Any]] = [[] for _ in range(14)]
        for r in rows:
            m = r.meta
            vals = (
                r.tag, r.timebucket, r.timeuuid, ticks(r.timeuuid), r.persistence_id, r.tag_pid_seq_nr,
                r.seq_nr, r.writer, r.event.ser_id, r.event.manifest, r.event.payload,
                m.ser_id if m else None, m.manifest if m else None, m.payload if m else None,
            )  # fmt: skip
            for c, v in zip(cols, vals, strict=True):
                c.append(v)
        await self._run("write tag rows", lambda conn: conn.execute(self.sql.insert_rows, *cols))

    async def write_progress(self, progress: Sequence[TagProgress]) -> None:
        args = (
            [p.persistence_id for p in progress], [p.tag for p in progress], [p.seq_nr for p in progress],
            [p.tag_pid_seq_nr for p in progress], [p.offset for p in progress],
        )  # fmt: skip
        await self._run("write tag progress", lambda conn: conn.execute(self.sql.upsert_progress, *args))

    async def read_progress(self, persistence_id: str) -> dict[str, TagProgress]:
        rows = await self._run("read tag progress", lambda conn: conn.fetch(self.sql.read_progress, persistence_id))
        return {
            r["tag"]: TagProgress(
                r["persistence_id"], r["tag"], r["sequence_nr"], r["tag_pid_sequence_nr"], r["offset"]
            )
            for r in rows
        }

    async def read_scanning(self, persistence_id: str) -> int:
        v = await self._run("read tag scanning", lambda conn: conn.fetchval(self.sql.read_scanning, persistence_id))
        return int(v or 0)

    async def write_scanning(self, persistence_id: str, seq_nr: int) -> None:
        await self._run(
            "write tag scanning", lambda conn: conn.execute(self.sql.upsert_scanning, persistence_id, seq_nr)
        )

    async def tagged_events(self, persistence_id: str, from_seq_nr: int, limit: int) -> list[TaggedEvent]:
        stmt = self.sql.tagged_events(self.conns.sql.t("event_journal"))
        rows = await self._run("read tagged events", lambda conn: conn.fetch(stmt, persistence_id, from_seq_nr, limit))
        return [
            TaggedEvent(
                persistence_id=r["persistence_id"],
                seq_nr=r["seq_nr"],
                timeuuid=timeuuid_for_event(r["db_timestamp"], r["persistence_id"], r["seq_nr"]),
                tags=tuple(r["tags"] or ()),
                event=Serialized(r["event_ser_id"], r["event_ser_manifest"], bytes(r["event_payload"])),
                writer=r["writer"],
                meta=_meta(r["meta_ser_id"], r["meta_ser_manifest"], r["meta_payload"]),
            )
            for r in rows
        ]

    async def read_tag_rows(
        self, tag: str, bucket: int, after: uuid.UUID | None, before_ticks: int, limit: int
    ) -> list[TagPageRow]:
        a_t, a_u = (ticks(after), after) if after is not None else (-1, _ZERO_UUID)
        # the records as they come (TAG_PAGE_COLUMNS is the TagPageRow layout): no object per row
        rows: list[TagPageRow] = await self._run(
            "read tag rows", lambda conn: conn.fetch(self.sql.read_rows, tag, bucket, a_t, a_u, before_ticks, limit)
        )
        return rows

    async def next_bucket(self, tag: str, from_bucket: int, to_bucket: int) -> int | None:
        v = await self._run(
            "next tag bucket", lambda conn: conn.fetchval(self.sql.next_bucket, tag, from_bucket, to_bucket)
        )
        return None if v is None else int(v)

    async def ensure_bucket_size(self, size: str) -> None:
        async def op(conn: asyncpg.Connection) -> None:
            async with conn.transaction():
                await conn.execute(self.sql.claim_setting, "bucket_size", size)
                stored = await conn.fetchval(self.sql.read_setting, "bucket_size")
                if stored == size:
                    return
                if await conn.fetchval(self.sql.any_rows):
                    raise ConfigurationError(
                        f"tag bucket size is {stored!r} in this journal and tagged data exists; it cannot "
                        f"change to {size!r} (queries would read the wrong partitions). Keep "
                        f"tags.bucket_size={stored!r}, or rebuild the tag views into a fresh journal."
                    )
                await conn.execute(self.sql.update_setting, "bucket_size", size)

        await self._run("check tag bucket size", op)
