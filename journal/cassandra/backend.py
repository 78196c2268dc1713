"""Journal storage on Cassandra (DataStax cassandra-driver): its parts put together; composed,
never derived from the Postgres backend.

Each concern lives in its own module over the shared :class:`~.connections.CassandraConnections`:
writes (:mod:`.writes`), reads by persistence id (:mod:`.reads`), snapshots (:mod:`.snapshots`),
``info`` (:mod:`.info`); the tag view and cleanup stores are composed. CQL lives in the package's
.cql files. Slice queries, ``write_on`` and replicated logs are PostgreSQL's: they raise
UnsupportedOperation here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..backend import (
    Backend,
    DurableStateStore,
    ReplicationStore,
    SharedConnections,
    SliceHome,
    SliceLeases,
    SliceQueryBackend,
    SnapshotSliceReads,
    TagRowWriter,
    TagStore,
)
from ..codec import KeyStore
from ..errors import UnsupportedOperation
from ..settings import JournalSettings
from .cleanup import CassandraCleanup
from .connections import CassandraConnections
from .info import CassandraInfo
from .snapshots import CassandraSnapshots
from .tag_store import CassandraTagStore
from .writes import CassandraWrites


class CassandraBackend(CassandraWrites, CassandraSnapshots, CassandraInfo):
    """Journal storage on Cassandra (:class:`~journal.backend.Backend`)."""

    name = "cassandra"

    def __init__(
        self,
        contact_points: list[str],
        port: int,
        keyspace: str,
        settings: JournalSettings,
        tag_writers: Callable[[TagStore], TagRowWriter],
    ) -> None:
        """``tag_writers``: makes the tag writers over this backend's tag store (composed above the
        seam by :func:`journal.backends.open_backend`)."""
        super().__init__(CassandraConnections(contact_points, port, keyspace, settings))
        self._tag_store = CassandraTagStore(self.conns, self)
        self.tag_writers = tag_writers(self._tag_store)
        self._cleanup = CassandraCleanup(self.conns, self, self, self._tag_store)

    async def start(self) -> None:
        await self.conns.open()
        await self._tag_store.ensure_bucket_size(self.settings.tags.bucket_size)

    async def close(self) -> None:
        await self.tag_writers.close()
        await self.conns.close()

    def tag_store(self) -> CassandraTagStore:
        return self._tag_store

    def cleanup_store(self) -> CassandraCleanup:
        """The cleanup tool's deletions (:mod:`journal.cleanup`)."""
        return self._cleanup

    def slice_queries(self) -> SliceQueryBackend:
        raise UnsupportedOperation("slice queries are not supported on the cassandra backend: use events_by_tag")

    def snapshot_slice_reads(self) -> SnapshotSliceReads:
        raise UnsupportedOperation("slice queries are not supported on the cassandra backend: use events_by_tag")

    def replication_store(self, location: str) -> ReplicationStore:
        raise UnsupportedOperation("replicated logs are not supported on the cassandra backend")

    def slice_leases(self, name: str, owner: str, ttl: float) -> SliceLeases:
        raise UnsupportedOperation("slice leases are not supported on the cassandra backend")

    async def slice_homes(self, min_slice: int, max_slice: int, *, fresh: bool = False) -> list[SliceHome]:
        raise UnsupportedOperation("slice queries are not supported on the cassandra backend: use events_by_tag")

    def pool_for(self, persistence_id: str) -> Any:
        raise UnsupportedOperation("persist_in is not supported on the cassandra backend (no PostgreSQL transaction)")

    def shared_connections(self) -> SharedConnections:
        raise UnsupportedOperation("the cassandra backend has no PostgreSQL pool to share")

    def key_store(self) -> KeyStore:
        raise UnsupportedOperation(
            "the cassandra backend has no key table: pass open_journal(..., key_store=...) to encrypt"
            " (your own KeyStore: a KMS, or a key table elsewhere)"
        )

    def durable_state_store(self) -> DurableStateStore:
        raise UnsupportedOperation(
            "durable state needs PostgreSQL: the cassandra backend has no durable_state table "
            "(Akka Persistence Cassandra has no durable state store either)"
        )


_check: type[Backend] = CassandraBackend
"""mypy checks here that the backend implements the whole seam."""
