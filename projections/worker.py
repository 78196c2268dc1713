"""A projection worker: slice leases through Postgres, one RangeProcessor per owned range.

Every ``lease_renew_interval`` the worker runs a round of :class:`journal.postgres.leases.
PostgresSliceLeases` (shared with the event routers): it heartbeats its membership row, renews
its leases, and rebalances: live workers sorted by id split the slices into contiguous chunks; a
worker stops (and commits) the processors of slices it should give away before releasing their
leases, and takes free or expired leases of its own chunk. A dead worker's leases expire after
``lease_ttl`` and its chunk goes to the others, which resume from the stored offsets. Safety does
not depend on timing: every offset transaction checks the lease epoch under a row lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg

from journal.backend import SharedConnections
from journal.errors import (
    ConfigurationError,
    DestinationRefused,
    EventsMissing,
    HandlerFailed,
    LeaseLost,
    UnsupportedOperation,
)
from journal.ids import NUMBER_OF_SLICES, runs, validate_entity_type, validate_name
from journal.postgres import PostgresSliceLeases, asyncpg_dsn, driver_error, target_of
from journal.serialization import SerializerRegistry
from journal.settings import JournalSettings, QueryMode
from journal.transaction_slots import TransactionSlots
from journal.waits import wait_set

from . import metrics
from .batches import Processor
from .handlers import Mode, check_handler, validate_mode
from .outage import Outage, database_unavailable
from .parts import ProjectionParts
from .postgres_store import ProjectionSql
from .recovery import HandlerRecovery
from .runner import EventSource, PageQuery, RangeProcessor
from .snapshot_handlers import with_snapshot_handler
from .source_facts import SourceFacts
from .stats import Stats
from .transactions import Connections
from .version_run import ProjectionVersioning

log = logging.getLogger("projections.worker")

OWN_POOL_SIZE = 8
"""Connections of the pool a worker opens when it cannot run on the journal's."""
QUICK_ROUND = 0.05
"""Seconds to the lease round after one that saw the members change (a first round too); each
further round waits twice as long, up to ``lease_renew_interval``. Workers started together
(the first one may see itself alone and take every slice) or rescaled then settle their slices
in a fraction of a second, not a renewal interval apart."""


def parse_key(key: str) -> range:
    lo, _, hi = key.partition("-")
    return range(int(lo), int(hi) + 1)


class Worker:
    """Runs one projection's share of slices until :meth:`stop` (or a fatal handler error)."""

    slice_count: int = NUMBER_OF_SLICES
    """Lease rows of the projection (a tag projection has one: see projections.tag_runner)."""
    lag_by_slice: bool = True
    """The metrics sample this worker's lag per slice range (a tag projection's is not by slice)."""
    lag_counts_states: bool = False
    """The sampled lag counts changed durable states (a state projection's), not events."""

    def __init__(
        self,
        journal: EventSource,
        settings: JournalSettings,
        name: str,
        entity_type: str,
        handler: Callable[..., Awaitable[None]],
        mode: str = "grouped",
        *,
        worker_id: str | None = None,
        recovery: str | HandlerRecovery | None = None,
        version: int | None = None,
        from_snapshots: bool = False,
        snapshot_handler: Callable[..., Awaitable[None]] | None = None,
    ) -> None:
        """``from_snapshots``: read each range from its pids' latest snapshots (a Journal on
        one PostgreSQL database), ``snapshot_handler`` turning a snapshot into the read model's
        state (:mod:`.snapshot_handlers`; without it the handler receives them)."""
        if snapshot_handler is not None and not from_snapshots:
            raise ConfigurationError("a snapshot handler needs from_snapshots=True")
        self.source = SourceFacts.of(journal)
        if from_snapshots and self.source.snapshot_pages is None:
            raise ConfigurationError("from_snapshots needs a Journal (its query from snapshots)")
        self.from_snapshots = from_snapshots
        self.journal = journal
        self.settings = settings
        self.ps = settings.projection
        self.version = ProjectionVersioning.of(settings.schema, name, version, mode)
        """A versioned projection's version (``run NAME --version N``: :mod:`.versions`), or None."""
        self.name = validate_name(name, "projection name") if self.version is None else self.version.versioned_name
        self.entity_type = validate_entity_type(entity_type, required=True)
        self.mode: Mode = validate_mode(mode)
        self.handler = check_handler(handler, mode)
        if snapshot_handler is not None:
            self.handler = with_snapshot_handler(self.handler, snapshot_handler, self.mode)
        self.recovery = HandlerRecovery.parse(recovery, self.ps)
        """What the processors do with an event the handler keeps failing on (:mod:`.recovery`)."""
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.sql = ProjectionSql(settings.schema)
        self.stats = Stats(self.name)
        self.error: str | None = None
        self._stored_error: str | None = None
        """What of ``error`` the worker's row keeps (:attr:`HandlerFailed.stored`)."""
        self._refused: DestinationRefused | None = None
        """The handler's destination refused the projection (credentials, ACL): :meth:`run` raises it."""
        self.epochs: dict[int, int] = {}
        self.processors: dict[tuple[int, int], tuple[Processor, asyncio.Task[None]]] = {}
        self._stop = asyncio.Event()
        self._pool: asyncpg.Pool | None = None
        self._owns_pool = False
        self._transactions = TransactionSlots(OWN_POOL_SIZE)
        """Its processors' transactions at once: the whole of its own pool (a handler's reads of
        the journal go to the journal's pool), or the shared pool's limit (:meth:`run`)."""
        self.leases = PostgresSliceLeases(
            self._own_pool, settings.schema, self.name, self.worker_id, self.ps.lease_ttl, self.slice_count
        )
        self.state = "running"
        self.outage = Outage(log, self.worker_id, quiet=self.ps.handler_max_backoff + self.ps.lease_renew_interval)
        """Database outages, shared with the processors (logged once each; shown by status)."""
        self.application_name = f"sj-projection {self.worker_id}"[:63]
        """Of the worker's connections (a server process of ours is told apart by it): its own
        pool's, or the journal's pool's when it runs on that (:meth:`_shared_connections`)."""
        metrics.track(self)

    def stop(self) -> None:
        self._stop.set()

    def _own_pool(self) -> asyncpg.Pool:
        assert self._pool is not None, "worker not running"
        return self._pool

    @property
    def owned(self) -> list[tuple[int, int]]:
        return sorted(self.processors)

    async def run(self) -> None:
        """Work until stopped; raise HandlerFailed / EventsMissing / DestinationRefused when the
        projection must stop."""
        dsn = self.settings.connection.dsn
        if dsn is None:
            raise ConfigurationError("Worker needs settings with a DSN (open the journal first)")
        shared = self._shared_connections(dsn)
        if shared is not None:
            if shared.transactions.limit < 1:
                raise ConfigurationError(
                    "connection.pool_max_size must be at least 3 for a projection worker on the journal's pool "
                    "(a handler may read the journal inside its transaction)"
                )
            self._pool, self.application_name = shared.pool, shared.application_name
            self._transactions = shared.transactions
        else:
            self._owns_pool = True
            self._pool = await asyncpg.create_pool(
                asyncpg_dsn(dsn), min_size=0, max_size=OWN_POOL_SIZE,
                server_settings={"application_name": self.application_name},
            )  # fmt: skip
        try:
            await self._start_up(dsn)
            last_prune = 0.0
            loop = asyncio.get_running_loop()
            pause = QUICK_ROUND
            while not self._stop.is_set() and self.error is None:
                seen = self.leases.members
                try:
                    await self._tick()
                    if loop.time() - last_prune > self.ps.offset_prune_interval and self.epochs:
                        last_prune = loop.time()
                        async with self._pool.acquire() as conn:
                            await self.sql.prune(
                                conn, self.name, sorted(self.epochs),
                                timedelta(seconds=self.ps.offset_delete_after),
                                timedelta(seconds=self.ps.offset_delete_after_consumed),
                            )  # fmt: skip
                    self.outage.answered()
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
                    if database_unavailable(e):
                        self.outage.failed("lease round", e)
                    else:
                        log.warning("%s: lease round failed (will retry): %s", self.worker_id, e)
                changed = self.leases.members != seen
                pause = QUICK_ROUND if changed else min(pause * 2, self.ps.lease_renew_interval)
                await wait_set(self._stop, pause)
        finally:
            await self._shutdown()
        if self._refused is not None:
            raise self._refused
        if self.error is not None:
            raise HandlerFailed(self.error)

    def _shared_connections(self, dsn: str) -> SharedConnections | None:
        """The journal's pool when the offsets live in its database (one pool per process; a
        partitioned journal's: the home database's). A source without one (a Cassandra journal,
        an EventSource of the caller's) or offsets kept elsewhere: the worker opens its own."""
        if self.source.backend is None:
            return None
        try:
            shared = self.source.backend.shared_connections()
        except UnsupportedOperation:
            return None
        return shared if shared.dsn == asyncpg_dsn(dsn) else None

    async def _start_up(self, dsn: str) -> None:
        """Create the lease rows; a database that is down is waited for, however long."""
        assert self._pool is not None
        delay = self.ps.handler_backoff
        while not self._stop.is_set():
            try:
                await self.leases.join()
                if self.version is not None:
                    await self.version.register(self._pool, self.entity_type)
                self.outage.answered()
                return
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
                if not database_unavailable(e):  # a wrong password, an unmigrated database: no retry fixes it
                    raise driver_error(f"projection {self.name} start-up", target_of(asyncpg_dsn(dsn)), e) from e
                self.outage.failed("start-up", e)
            await wait_set(self._stop, delay)
            delay = min(delay * 2, self.ps.handler_max_backoff)

    async def _tick(self) -> None:
        pool = self._pool
        assert pool is not None
        self._reap()
        if self.error is not None:
            return
        if self.version is not None and not await self.version.current(pool):
            self.stop()  # retired by a switch (or dropped): the serving version is another
            return
        held = dict(
            await self.leases.rebalance(self._stop_processors, events=self.stats.events, error=self.outage.note())
        )
        async with pool.acquire() as conn:
            paused = await self.sql.paused_keys(conn, self.name)
        self.epochs = held
        paused_slices: set[int] = set()
        for key in paused:
            with contextlib.suppress(ValueError):
                paused_slices.update(parse_key(key))
        active = await self._by_database(runs(set(held) - paused_slices))
        for r in [r for r in self.processors if r not in active]:
            await self._stop_processors(set(range(r[0], r[1] + 1)))
        for lo, hi in active:
            if (lo, hi) not in self.processors:
                self._start(lo, hi)

    async def _by_database(self, ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The ranges cut where the database serving them changes (the backend says where each
        slice lives): each processor reads one database's slices, so one database down stops
        only the processors of its slices (docs/scaling-out.md). A source of the caller's: as given."""
        backend = self.source.backend
        if backend is None:
            return ranges
        return [(h.min_slice, h.max_slice) for lo, hi in ranges for h in await backend.slice_homes(lo, hi)]

    @property
    def serializers(self) -> SerializerRegistry | None:
        """The journal's (they seal dead letters when it encrypts); None for another source."""
        return self.source.serializers

    def _start(self, lo: int, hi: int) -> None:
        proc = self._processor(lo, hi)
        task = asyncio.create_task(proc.run(), name=f"{self.name}:{proc.key}")
        self.processors[(lo, hi)] = (proc, task)
        log.info("%s: processing %s", self.worker_id, proc.key)

    def _processor(self, lo: int, hi: int) -> Processor:
        """The processor of slices ``lo..hi`` (a tag worker's: of its tag)."""
        return RangeProcessor(
            self._parts(), entity_type=self.entity_type, lo=lo, hi=hi,
            epochs={s: self.epochs[s] for s in range(lo, hi + 1)}, query_mode=self._query_mode(),
            pages=self._pages(), from_snapshots=self.from_snapshots,
        )  # fmt: skip

    def _pages(self) -> PageQuery | None:
        """The journal's query a page at a time: from snapshots when asked to start from them."""
        return self.source.snapshot_pages if self.from_snapshots else self.source.pages

    def _parts(self) -> ProjectionParts:
        """What the processors are made from: the projection's, and the connections :meth:`run` chose."""
        return ProjectionParts(
            self.journal, self._connections(), self.sql, self.ps, self.name, self.worker_id, self.handler, self.mode,
            self.stats, self.outage, self.recovery, self.serializers,
        )  # fmt: skip

    def _connections(self) -> Connections:
        """What the processors run their transactions on: the pool :meth:`run` chose (the
        journal's, lent through the seam, or the worker's own), its slots and its name."""
        assert self._pool is not None
        prelude = None if self.version is None else self.version.use_schema
        return Connections(self._pool, self._transactions, self.application_name, prelude)

    def _query_mode(self) -> QueryMode:
        """The mode of the slice queries the processors read: the journal's default, which the
        runner does not override (a source without settings: ours)."""
        return self.source.query_mode or self.settings.query.mode

    def _reap(self) -> None:
        """Forget finished processors; a fatal error stops the worker."""
        for key, (_, task) in list(self.processors.items()):
            if not task.done():
                continue
            del self.processors[key]
            exc = task.exception() if not task.cancelled() else None
            if isinstance(exc, HandlerFailed | EventsMissing | DestinationRefused):
                self._refused = exc if isinstance(exc, DestinationRefused) else self._refused
                self.error = str(exc)
                self._stored_error = exc.stored if isinstance(exc, HandlerFailed) else self.error
                log.error("%s: projection stopped: %s", self.worker_id, exc)
            elif isinstance(exc, LeaseLost):
                log.info("%s: %s", self.worker_id, exc)
            elif exc is not None:
                log.warning("%s: slices %s failed, restarting: %r", self.worker_id, key, exc)

    async def _stop_processors(self, slices: set[int]) -> None:
        victims = [k for k in self.processors if any(s in slices for s in range(k[0], k[1] + 1))]
        for k in victims:
            self.processors[k][0].stop()
        tasks = {self.processors[k][1] for k in victims}
        if tasks:
            # a batch commits in well under this; a processor stuck beyond it is cancelled (its open
            # transaction, if any, rolls back) so lease renewal and hand-over go on
            _, late = await asyncio.wait(tasks, timeout=self.ps.lease_ttl / 2)
            for t in late:
                log.warning("%s: processor %s did not stop in time, cancelling it", self.worker_id, t.get_name())
                t.cancel()
            if late:
                await asyncio.wait(late, timeout=2.0)
        for k in victims:
            if self.processors[k][1].done():
                continue
            del self.processors[k]  # still unwinding: forgotten, its commits are fenced anyway
        self._reap()

    async def _shutdown(self) -> None:
        await self._stop_processors(set(range(NUMBER_OF_SLICES)))
        pool = self._pool
        if pool is None:
            return
        try:
            self.state = "failed" if self.error else "stopped"
            await self.leases.leave(state=self.state, events=self.stats.events, error=self._stored_error)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            log.warning("%s: could not release leases (they expire in %ss): %s", self.worker_id, self.ps.lease_ttl, e)
        finally:
            self._pool = None
            if self._owns_pool:  # the journal's pool is the journal's to close
                self._owns_pool = False
                await pool.close()


async def run_workers(workers: list[Worker], on_tick: Callable[[], Any] | None = None) -> None:
    """Run several workers of one process together (``--workers K``)."""
    await asyncio.gather(*(w.run() for w in workers))
