"""Tag tests on both backends: a journal with fast tag settings, its :class:`TagStore`, and a raw
view of the tag tables per backend (to simulate crashes: rows or progress that never got written).

Raw access goes through each backend's own driver (asyncpg, cassandra-driver) against the real
server: no mocks. Used by test_tag_store_contract.py and test_tags_backends.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

import asyncpg
from cassandra_fixtures import open_test_journal

from journal import Journal
from journal.backend import TagStore

FAST: dict[str, Any] = dict(
    eventual_consistency_delay=0.0,
    query_refresh_interval=0.05,
    gap_timeout=1.5,
    back_track_interval=0.1,
    back_track_period=5.0,  # the reference default: rows landing late under load (a loaded CI machine) still found
    tag_write_timeout=1.0,
    retry_initial_backoff=0.02,
    retry_max_backoff=0.1,
)

TagRowKey = tuple[str, str, int, int]
"""(tag, persistence_id, tag_pid_sequence_nr, sequence_nr) of a stored tag row."""


class RawTags(Protocol):
    """What the tests read and break behind the store's back, per backend."""

    async def tag_rows(self) -> list[tuple[Any, ...]]:
        """Every tag row as (tag, pid, tag_pid_seq_nr, seq_nr, timebucket, timeuuid, payload), sorted."""
        ...

    async def delete_tag_rows(self, tag: str, above: int) -> None:
        """Lose the rows of ``tag`` with tag_pid_sequence_nr above ``above`` (a crash before the write)."""
        ...

    async def delete_progress(self, pid: str) -> None:
        """Lose the pid's tag_write_progress and tag_scanning rows (a crash before they were written)."""
        ...

    async def store_event(self, pid: str, seq_nr: int, ts: datetime, tags: Sequence[str], payload: bytes) -> None:
        """Store an event row without its tag rows (the events write of the Cassandra path)."""
        ...


class PostgresRaw:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn

    async def _q(self, sql: str, *args: Any) -> list[Any]:
        conn = await asyncpg.connect(self.dsn)
        try:
            return list(await conn.fetch(sql, *args))
        finally:
            await conn.close()

    async def tag_rows(self) -> list[tuple[Any, ...]]:
        rows = await self._q(
            "SELECT tag_name, persistence_id, tag_pid_sequence_nr, sequence_nr, timebucket, timestamp, event "
            "FROM tag_views"
        )
        return sorted((r[0], r[1], r[2], r[3], r[4], r[5], bytes(r[6])) for r in rows)

    async def delete_tag_rows(self, tag: str, above: int) -> None:
        await self._q("DELETE FROM tag_views WHERE tag_name = $1 AND tag_pid_sequence_nr > $2", tag, above)

    async def delete_progress(self, pid: str) -> None:
        await self._q("DELETE FROM tag_write_progress WHERE persistence_id = $1", pid)
        await self._q("DELETE FROM tag_scanning WHERE persistence_id = $1", pid)

    async def store_event(self, pid: str, seq_nr: int, ts: datetime, tags: Sequence[str], payload: bytes) -> None:
        from journal.ids import entity_type_of, slice_for

        await self._q(
            "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
            "event_ser_manifest, event_payload, writer, tags) VALUES ($1, $2, $3, $4, $5, 1, '', $6, 'w', $7)",
            slice_for(pid), entity_type_of(pid), pid, seq_nr, ts, payload, list(tags) or None,
        )  # fmt: skip


class CassandraRaw:
    def __init__(self, session: Any, keyspace: str) -> None:
        self.s = session
        self.ks = keyspace

    async def _q(self, cql: str, *args: Any) -> list[Any]:
        return list(await asyncio.to_thread(self.s.execute, cql, args, timeout=60))

    async def tag_rows(self) -> list[tuple[Any, ...]]:
        rows = await self._q(
            f"SELECT tag_name, persistence_id, tag_pid_sequence_nr, sequence_nr, timebucket, timestamp, event "
            f"FROM {self.ks}.tag_views"
        )
        return sorted((r[0], r[1], r[2], r[3], r[4], r[5], bytes(r[6])) for r in rows)

    async def delete_tag_rows(self, tag: str, above: int) -> None:
        for r in await self._q(
            f"SELECT tag_name, timebucket, timestamp, persistence_id, tag_pid_sequence_nr FROM {self.ks}.tag_views"
        ):
            if r.tag_name == tag and r.tag_pid_sequence_nr > above:
                await self._q(
                    f"DELETE FROM {self.ks}.tag_views WHERE tag_name = %s AND timebucket = %s AND timestamp = %s "
                    "AND persistence_id = %s AND tag_pid_sequence_nr = %s",
                    r.tag_name, r.timebucket, r.timestamp, r.persistence_id, r.tag_pid_sequence_nr,
                )  # fmt: skip

    async def delete_progress(self, pid: str) -> None:
        await self._q(f"DELETE FROM {self.ks}.tag_write_progress WHERE persistence_id = %s", pid)
        await self._q(f"DELETE FROM {self.ks}.tag_scanning WHERE persistence_id = %s", pid)

    async def store_event(self, pid: str, seq_nr: int, ts: datetime, tags: Sequence[str], payload: bytes) -> None:
        from journal.buckets import bucket_of
        from journal.timeuuid import timeuuid_for_event

        u = timeuuid_for_event(ts, pid, seq_nr)
        await self._q(
            f"INSERT INTO {self.ks}.messages (persistence_id, partition_nr, sequence_nr, timestamp, timebucket, "
            "writer_uuid, ser_id, ser_manifest, event_manifest, event, tags) "
            "VALUES (%s, 0, %s, %s, %s, 'w', 1, '', '', %s, %s)",
            pid, seq_nr, u, str(bucket_of(u, "Hour")), payload, set(tags) or None,
        )  # fmt: skip


@dataclass
class TagBackend:
    """An open journal, its tag store, and raw access to its tables."""

    journal: Journal
    target: str
    raw: RawTags

    @property
    def name(self) -> str:
        return self.journal.backend.name

    @property
    def store(self) -> TagStore:
        store = self.journal.backend.tag_store()  # type: ignore[attr-defined]
        assert isinstance(store, TagStore)
        return store


@asynccontextmanager
async def open_tag_backend(
    target: str, cassandra_session: Any, clean: bool = True, **more: Any
) -> AsyncIterator[TagBackend]:
    """``target`` from the ``journal_target`` fixture; ``cassandra_session`` only used on Cassandra."""
    async with open_test_journal(target, clean=clean, **{**FAST, **more}) as j:
        if target.startswith("cassandra://"):
            raw: RawTags = CassandraRaw(cassandra_session, urlsplit(target).path.strip("/"))
        else:
            raw = PostgresRaw(target)
        yield TagBackend(j, target, raw)
