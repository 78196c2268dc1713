"""The journal over several PostgreSQL databases by slice range: one backend per database, composed.

:class:`PartitionedBackend` implements the whole seam (:class:`~journal.backend.Backend`) by
routing each operation to the database that serves its slice (writes split by database, reads by
persistence id, snapshots, deletes, the tag view, cleanup), and by reading slice ranges where
they are served (:mod:`.slice_reads`); its durable state store routes the same way
(:mod:`.states`). It never inherits from the PostgreSQL backend: it holds one per database
(:mod:`.databases`). The journal's home database (``dsn``; default: the first one) holds what
belongs to a journal rather than to a slice: projection offsets and read models, leases, dead
letters, the encryption keys. See docs/scaling-out.md.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

from ..backend import (
    Backend,
    ManifestCount,
    SharedConnections,
    SliceHome,
    SliceLeases,
    SnapshotRow,
    SnapshotSliceReads,
    WriteCheck,
)
from ..errors import UnsupportedOperation
from ..ids import slice_for
from ..postgres import MOVED, PostgresBackend, PostgresKeyStore, redact
from ..settings import JournalSettings
from ..write_batch import BatchResult, WriteBatch
from .databases import Databases
from .layout import NOWHERE
from .replication import PartitionedReplicationStore
from .routing import Router
from .slice_reads import PartitionedSliceReads
from .states import PartitionedDurableState
from .stores import PartitionedCleanup, PartitionedTagStore
from .writes import PartitionedWrites


class PartitionedBackend:
    """Journal storage on several PostgreSQL databases (:class:`~journal.backend.Backend`)."""

    name = "partitioned"

    def __init__(self, databases: Sequence[str], settings: JournalSettings, home: str | None = None) -> None:
        self.settings = settings
        self.writer_id = settings.write.writer_id or str(uuid.uuid4())
        self.dsn = home or databases[0]
        self.dbs = Databases(databases, settings.with_dsn(None), self.writer_id, given=(self.dsn,))
        self.router = Router(self.dbs)
        self.slices = PartitionedSliceReads(self.dbs, self.router)
        self._writes = PartitionedWrites(self.dbs, self.router)
        self._tags = PartitionedTagStore(self.dbs, self.router)
        self._cleanup = PartitionedCleanup(self.router)
        self._states = PartitionedDurableState(self.dbs, self.router)
        self._home: PostgresBackend | None = None

    async def start(self, *, claim: bool = True) -> None:
        """Open every database and load the map (``claim``: record each configured database's
        range of the layout where its map is still empty)."""
        await self.dbs.open(claim=claim)
        await self._tags.ensure_bucket_size(self.settings.tags.bucket_size)
        await self.home()

    async def close(self) -> None:
        if self._home is not None:
            await self._home.close()
            self._home = None
        await self.dbs.close()

    async def home(self) -> PostgresBackend:
        """The home database's backend (one of the journal's databases, or its own)."""
        if self.dsn in self.dbs.dsns:
            return await self.dbs.usable(self.dbs.dsns.index(self.dsn))
        if self._home is None:
            self._home = PostgresBackend(self.dsn, self.settings.with_dsn(self.dsn))
            self._home.writer_id = self.writer_id
            await self._home.start()
            if not await self._home.partitions().rows():  # it holds no slice: no event is ever written there
                await self._home.partitions().set_range(0, 1023, MOVED, 0)
        return self._home

    # -- writes -------------------------------------------------------------------------------

    async def write_batch(self, batch: WriteBatch) -> BatchResult:
        return await self._writes.write_batch(batch)

    async def write_chunks(self, chunks: Iterator[WriteBatch]) -> list[BatchResult]:
        return await self._writes.write_chunks(chunks)

    async def write_on(self, conn: Any, batch: WriteBatch) -> BatchResult:
        """On the caller's connection, which must be to the database serving the batch's
        slices (``pool_for``); any other database refuses it (SliceRangeMoved)."""
        backend = await self.dbs.usable(max(self.dbs.map.owner(batch.slices[0]), 0))
        return await backend.write_on(conn, batch)

    def pool_for(self, persistence_id: str) -> Any:
        """The connection pool of the database serving the pid's slice now (for ``persist_in``)."""
        return self.dbs.backends[max(self.dbs.map.owner(slice_for(persistence_id)), 0)].pool

    async def slice_homes(self, min_slice: int, max_slice: int, *, fresh: bool = False) -> list[SliceHome]:
        """The runs of the range by the database serving each (as of the map last loaded, or
        read afresh); a run that a move is switching right now has no database (``dsn`` None)."""
        m = await self.dbs.reload() if fresh else self.dbs.map
        return [
            SliceHome(p.min_slice, p.max_slice, None, "(being switched)")
            if p.database == NOWHERE
            else SliceHome(p.min_slice, p.max_slice, self.dbs.dsns[p.database], self.dbs.names[p.database])
            for p in m.pieces(min_slice, max_slice)
        ]

    async def check_write(self, batch: WriteBatch) -> list[WriteCheck]:
        """Each call where its slice is served."""

        async def one(i: int) -> WriteCheck:
            call = batch.select([i])
            (got,) = await self.router.on_owner(
                batch.slices[i], "resolve write", lambda b: b.check_write(call), check="read"
            )
            return got

        return list(await asyncio.gather(*(one(i) for i in range(len(batch)))))

    async def highest_seq_nr(self, persistence_id: str) -> int:
        return await self.router.on_owner(
            slice_for(persistence_id), "highest_seq_nr", lambda b: b.highest_seq_nr(persistence_id), check="read"
        )

    async def delete_events_to(self, persistence_id: str, to_seq_nr: int) -> None:
        await self.router.on_owner(
            slice_for(persistence_id), "delete events", lambda b: b.delete_events_to(persistence_id, to_seq_nr)
        )

    # -- reads by pid -------------------------------------------------------------------------

    async def read_events(self, persistence_id: str, from_seq_nr: int, to_seq_nr: int, limit: int) -> Any:
        return await self.slices.read_events(persistence_id, from_seq_nr, to_seq_nr, limit)

    async def persistence_ids(self, entity_type: str | None, after: str | None, limit: int) -> list[str]:
        return await self.slices.persistence_ids(entity_type, after, limit)

    # -- snapshots ----------------------------------------------------------------------------

    async def save_snapshot(self, row: SnapshotRow, keep: int = 1) -> None:
        await self.router.on_owner(row.slice, "save snapshot", lambda b: b.save_snapshot(row, keep), check="write")

    async def load_snapshot(self, persistence_id: str) -> SnapshotRow | None:
        return await self.router.on_owner(
            slice_for(persistence_id), "load snapshot", lambda b: b.load_snapshot(persistence_id), check="read"
        )

    async def load_snapshots(self, persistence_id: str, limit: int) -> list[SnapshotRow]:
        return await self.router.on_owner(
            slice_for(persistence_id), "load snapshots", lambda b: b.load_snapshots(persistence_id, limit), check="read"
        )

    async def delete_snapshot(self, persistence_id: str) -> None:
        await self.router.on_owner(
            slice_for(persistence_id), "delete snapshot", lambda b: b.delete_snapshot(persistence_id), check="write"
        )

    # -- what the storage reports -------------------------------------------------------------

    async def info(self) -> dict[str, Any]:
        """Each database's report (server, revision, events, the slices it serves), the totals
        (``events``: counted where each slice is served) and the map epoch."""
        m = self.dbs.map
        ranges: dict[int, list[str]] = {}
        for p in m.pieces(0, 1023):
            ranges.setdefault(p.database, []).append(f"{p.min_slice}-{p.max_slice}")
        reports = []
        total: Counter[str] = Counter()
        for i, name in enumerate(self.dbs.names):
            try:
                got = await (await self.dbs.usable(i)).info()
            except Exception as e:  # a database that does not answer is reported as such
                reports.append({"database": name, "error": str(e), "slices": ranges.get(i, [])})
                continue
            reports.append({"database": name, **got, "slices": ranges.get(i, [])})
            if i in ranges:
                total.update(got["events"])
        first = next((r for r in reports if "error" not in r), {})
        return {
            "server_version": first.get("server_version"), "schema_revision": first.get("schema_revision"),
            "events": dict(sorted(total.items())), "databases": reports, "epoch": m.epoch,
            "home": redact(self.dsn),
        }  # fmt: skip

    async def manifests(self) -> list[ManifestCount]:
        async def one(db: int) -> list[ManifestCount]:
            return await (await self.dbs.usable(db)).manifests()

        got = await asyncio.gather(*(one(db) for db in self.dbs.map.served()))
        counts: Counter[tuple[str, int, str]] = Counter()
        for its in got:
            for c in its:
                counts[(c.kind, c.ser_id, c.manifest)] += c.rows
        return [ManifestCount(k, i, m, n) for (k, i, m), n in sorted(counts.items())]

    # -- stores -------------------------------------------------------------------------------

    def slice_queries(self) -> PartitionedSliceReads:
        return self.slices

    def snapshot_slice_reads(self) -> SnapshotSliceReads:
        raise UnsupportedOperation("starting from snapshots needs one database (this journal is partitioned)")

    def tag_store(self) -> PartitionedTagStore:
        return self._tags

    def cleanup_store(self) -> PartitionedCleanup:
        return self._cleanup

    def replication_store(self, location: str) -> PartitionedReplicationStore:
        """The location's logs: their state in the home database, their events by slice."""
        return PartitionedReplicationStore(self.dbs, self.router, self._home_backend, location)

    def _home_backend(self) -> PostgresBackend:
        if self.dsn in self.dbs.dsns:
            return self.dbs.backends[self.dbs.dsns.index(self.dsn)]
        if self._home is None:
            raise UnsupportedOperation("the journal is not open")
        return self._home

    def key_store(self) -> PostgresKeyStore:
        """The encryption keys live in the home database (they belong to subjects, not slices)."""
        return self._home_backend().key_store()

    def shared_connections(self) -> SharedConnections:
        """The home database's pool (projections keep their offsets and read models there)."""
        return self._home_backend().shared_connections()

    def slice_leases(self, name: str, owner: str, ttl: float) -> SliceLeases:
        """Leases of a job over slices live in the home database (they belong to the job)."""
        return self._home_backend().slice_leases(name, owner, ttl)

    def durable_state_store(self) -> PartitionedDurableState:
        """Each state in the database serving its slice (:mod:`.states`)."""
        return self._states


_check: type[Backend] = PartitionedBackend
"""mypy checks here that the backend implements the whole seam."""
