"""The PostgreSQL backend (asyncpg on every hot path): its parts put together.

Each concern lives in its own module over the shared :class:`~.connections.PostgresConnections`:
writes and the resolution of interrupted writes (:mod:`.writes`), reads by persistence id
(:mod:`.reads`), snapshots (:mod:`.snapshots`), ``info`` (:mod:`.info`); the slice reads
(:mod:`.slice_reader`), the tag view, cleanup and replicated-log stores are composed. SQL lives in
the statements modules.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from ..backend import Backend, ReplicationStore, SliceHome, SliceLeases, SliceQueryBackend, SnapshotSliceReads
from ..settings import JournalSettings
from ..write_batch import BatchResult, WriteBatch
from .bulk_writes import BulkWrite
from .cleanup import PostgresCleanup
from .connections import PostgresConnections
from .dsn import redact
from .durable_state import PostgresDurableState
from .info import PostgresInfo
from .key_store import PostgresKeyStore
from .partitions import PostgresPartitions
from .reads import PostgresReads
from .slice_reader import PostgresSliceReader
from .snapshot_slices import PostgresSnapshotSlices
from .snapshots import PostgresSnapshots
from .tag_store import PostgresTagStore
from .writer_connections import WriterConnections
from .writes import PostgresWrites


class PostgresBackend(PostgresWrites, PostgresReads, PostgresSnapshots, PostgresInfo):
    """Journal storage on PostgreSQL (:class:`~journal.backend.Backend`)."""

    name = "postgres"

    def __init__(self, dsn: str, settings: JournalSettings) -> None:
        super().__init__(PostgresConnections(dsn, settings, settings.write.writer_id or str(uuid.uuid4())))
        self.dsn = self.conns.dsn
        self.slices = PostgresSliceReader(self.conns)
        self._tag_store = PostgresTagStore(self.conns)
        self._cleanup = PostgresCleanup(self.conns, self.delete_events_to)
        self._partitions = PostgresPartitions(self.conns)
        self._durable_state = PostgresDurableState(self.conns)

    async def start(self) -> None:
        await self.conns.open()
        await self._tag_store.ensure_bucket_size(self.settings.tags.bucket_size)
        # a database another journal partitioned: write with the newest epoch of its map (a
        # range that moved away is refused, never written here)
        self.use_epoch(max((r.epoch for r in await self._partitions.rows()), default=0))

    def use_epoch(self, epoch: int) -> None:
        """The partition map epoch this backend's writes and slice reads send."""
        self.conns.epoch = epoch

    def partitions(self) -> PostgresPartitions:
        """This database's part of the partition map, and a move's row work."""
        return self._partitions

    async def close(self) -> None:
        await self.conns.close()

    async def write_chunks(self, chunks: Iterator[WriteBatch]) -> list[BatchResult]:
        """A bulk write on up to ``write.bulk_in_flight`` connections (:mod:`.bulk_writes`)."""
        return await BulkWrite(self, self.settings.write.bulk_in_flight).run(chunks)

    @property
    def writers(self) -> WriterConnections:
        """The group commit's write connections."""
        return self.conns.writers

    def slice_queries(self) -> SliceQueryBackend:
        return self.slices

    def snapshot_slice_reads(self) -> SnapshotSliceReads:
        """The slice pages that start from snapshots (:mod:`.snapshot_slices`)."""
        return PostgresSnapshotSlices(self.conns)

    def tag_store(self) -> PostgresTagStore:
        """The tag view store (events by tag and the tag writer run over it)."""
        return self._tag_store

    def cleanup_store(self) -> PostgresCleanup:
        """The cleanup tool's deletions (:mod:`journal.cleanup`)."""
        return self._cleanup

    def replication_store(self, location: str) -> ReplicationStore:
        """The replicated logs of ``location`` in this database."""
        from .replication_store import PostgresReplicationStore

        return PostgresReplicationStore(self, location)

    def slice_leases(self, name: str, owner: str, ttl: float) -> SliceLeases:
        """Slice leases of the job ``name`` over the journal's pool (:mod:`.leases`)."""
        from .leases import PostgresSliceLeases

        return PostgresSliceLeases(lambda: self.conns.pool, self.settings.schema, name, owner, ttl)

    async def slice_homes(self, min_slice: int, max_slice: int, *, fresh: bool = False) -> list[SliceHome]:
        """One database: all slices here."""
        dsn = self.settings.connection.dsn or self.dsn
        return [SliceHome(min_slice, max_slice, dsn, redact(dsn))]

    def pool_for(self, persistence_id: str) -> Any:
        """The journal's pool (every slice is here)."""
        return self.conns.pool

    def shared_connections(self) -> PostgresConnections:
        """The journal's pool, lent to the projection workers and tools of this process."""
        return self.conns

    def key_store(self) -> PostgresKeyStore:
        """The ``encryption_key`` table (keys wrapped with ``codec.master_key`` when it is set)."""
        from ..codec import MasterKey

        master = self.settings.codec.master_key
        return PostgresKeyStore(self.conns, MasterKey.from_base64(master) if master else None)

    def durable_state_store(self) -> PostgresDurableState:
        """The ``durable_state`` table over the journal's pool (docs/durable-state.md)."""
        return self._durable_state


_check: type[Backend] = PostgresBackend
"""mypy checks here that the backend implements the whole seam."""
