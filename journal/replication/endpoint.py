"""A replication endpoint: serves this location's logs over gRPC and pulls its connections' logs.

One endpoint per location. It owns the location's journal (its database, or databases), stamps the
local events into the logs, answers reads, wakes connected endpoints on changes (``Watch``), pulls
every (connection, log) pair in its own loop and publishes availability. Surfaces layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from ..backend import ReplicationStore
from ..errors import ConfigurationError, InvalidArgument
from ..journal import Journal, open_journal
from ..replicated import ReplicationBatch
from ..settings import JournalSettings
from .availability import Availability, Available, FailureDetector, Unavailable
from .config import Connection, EndpointConfig
from .filters import EndpointFilters, not_private
from .recovery import StepGate, recover_logs
from .replicator import LocalSource, ReadRequest, Replicator
from .transport import RemoteSource, generic_handler, server_credentials

log = logging.getLogger("journal.replication")


class ReplicationEndpoint:
    """Start with :meth:`start` (or ``async with``), stop with :meth:`stop`."""

    def __init__(
        self,
        config: EndpointConfig,
        settings: JournalSettings | None = None,
        filters: EndpointFilters | None = None,
        *,
        recover: bool = False,
    ) -> None:
        """``recover``: this location's database was lost; :meth:`start` flags its logs as
        recovering before anything is stamped, pulled or served, and :meth:`recover` must then
        complete before the endpoint pulls or stamps (see :mod:`.recovery`)."""
        self.config = config
        self._recover_at_start = recover
        self._gate = StepGate()
        if filters is not None and (config.filters.source_logs or config.filters.target_locations):
            raise ConfigurationError("filters given both in the endpoint config and in code: give them in one place")
        self.filters = filters or config.filters
        if config.private_tags:
            private = not_private(*config.private_tags)
            everywhere = private if self.filters.all_logs is None else self.filters.all_logs & private
            self.filters = EndpointFilters(self.filters.source_logs, self.filters.target_locations, everywhere)
        self._settings = settings or JournalSettings.load(dsn=config.dsn)
        self._journal: Journal | None = None
        self._journal_cm: contextlib.AbstractAsyncContextManager[Journal] | None = None
        self._store: ReplicationStore | None = None
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._sources: list[RemoteSource] = []
        self._watchers: set[asyncio.Queue[str]] = set()
        self._local_change = asyncio.Event()
        self._wake: dict[tuple[str, str], asyncio.Event] = {}
        self._detectors: dict[tuple[str, str], FailureDetector] = {}
        self._remote_location: dict[str, str] = {}
        self._subscribers: set[asyncio.Queue[Availability]] = set()
        self._listening: Any = None
        self.bound_port: int | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def store(self) -> ReplicationStore:
        assert self._store is not None, "endpoint not started"
        return self._store

    @property
    def journal(self) -> Journal:
        assert self._journal is not None, "endpoint not started"
        return self._journal

    async def start(self) -> None:
        c = self.config
        self._journal_cm = open_journal(c.dsn, settings=self._settings, migrate=c.migrate)
        self._journal = await self._journal_cm.__aenter__()
        backend = self._journal.backend
        try:  # UnsupportedOperation off PostgreSQL
            self._store = backend.replication_store(c.location)
        except BaseException:
            await self.stop()  # the journal just opened is closed again
            raise
        for name in c.logs:
            await self._store.ensure_log(name)
        if self._recover_at_start:  # first of all: nothing may stamp or pull before recovery is done
            await self._store.begin_recovery(c.logs)
        if await self._store.recovering(c.logs):
            await self._gate.close()
        self._source = LocalSource(self._store, c.application, self.filters)
        self._listening = await backend.slice_queries().listen(self._on_notify, self._on_reconnect)
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((generic_handler(self._serve_read, self.info, self._serve_watch),))
        try:
            self.bound_port = (
                server.add_secure_port(c.listen, server_credentials(c.tls))
                if c.tls
                else server.add_insecure_port(c.listen)
            )
        except (RuntimeError, ConfigurationError) as e:  # grpc: "Failed to bind to address ..."
            await self.stop()
            if isinstance(e, ConfigurationError):
                raise
            raise ConfigurationError(
                f"cannot listen on {c.listen}: the port is in use, or the address is not one of this host's"
            ) from e
        await server.start()
        self._server = server
        now = time.monotonic()
        self._spawn(self._stamp_loop())
        self._spawn(self._detect_loop())
        for conn in c.connections:
            source = RemoteSource(conn.address, c.tls, timeout=max(c.failure_detection_limit, 5.0))
            self._sources.append(source)
            for name in c.logs_of(conn):
                self._wake[(conn.address, name)] = asyncio.Event()
                self._detectors[(conn.address, name)] = FailureDetector(
                    conn.address, name, c.failure_detection_limit, now
                )
                self._spawn(self._pull_loop(conn, source, name))
            if c.update_notifications:
                self._spawn(self._watch_loop(conn, source))
        log.info("endpoint %s serving %s on %s", c.location, list(c.logs), c.listen)

    async def stop(self) -> None:
        pending = set(self._tasks)
        while pending:
            for t in pending:
                t.cancel()
            # a task that swallowed its cancellation (a library may) is cancelled again, never awaited forever
            _, pending = await asyncio.wait(pending, timeout=1.0)
        for t in self._tasks:
            if not t.cancelled() and t.exception() is not None:
                log.debug("%s: task ended with %r", self.config.location, t.exception())
        self._tasks = []
        if self._server is not None:
            await self._server.stop(grace=0.5)
            self._server = None
        for s in self._sources:
            await s.close()
        self._sources = []
        if self._listening is not None:
            await self._listening.close()
            self._listening = None
        if self._journal_cm is not None:
            await self._journal_cm.__aexit__(None, None, None)
            self._journal_cm = None

    async def __aenter__(self) -> ReplicationEndpoint:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _spawn(self, coro: Any) -> None:
        self._tasks.append(asyncio.create_task(coro))

    # -- availability (failure detection) ------------------------------------------------------

    def subscribe(self) -> asyncio.Queue[Availability]:
        """A queue that receives ``Available``/``Unavailable`` once per failure-detection limit
        for every remote log. Drop it with :meth:`unsubscribe`."""
        q: asyncio.Queue[Availability] = asyncio.Queue(maxsize=10_000)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[Availability]) -> None:
        self._subscribers.discard(q)

    async def _detect_loop(self) -> None:
        limit = self.config.failure_detection_limit
        while True:
            await asyncio.sleep(min(limit, 1.0) if not any(d.state for d in self._detectors.values()) else limit)
            now = time.monotonic()
            for d in self._detectors.values():
                if d.state is not None and now - d.started < limit:
                    continue
                event = d.check(now)
                if event is None:
                    continue
                if not isinstance(event, Available):
                    log.warning("%s: remote log %s at %s unavailable: %s", self.config.location, d.log_name,
                                d.endpoint, "; ".join(event.causes))  # fmt: skip
                for q in list(self._subscribers):
                    with contextlib.suppress(asyncio.QueueFull):
                        q.put_nowait(event)

    # -- serving -------------------------------------------------------------------------------

    def _on_notify(self, payload: str) -> None:
        entity_type = payload.partition(":")[2]
        if entity_type in self.config.logs:
            self._local_change.set()
            for q in list(self._watchers):
                with contextlib.suppress(asyncio.QueueFull):
                    q.put_nowait(entity_type)

    def _on_reconnect(self) -> None:
        self._local_change.set()
        for name in self.config.logs:
            for q in list(self._watchers):
                with contextlib.suppress(asyncio.QueueFull):
                    q.put_nowait(name)

    async def _serve_read(self, request: ReadRequest) -> ReplicationBatch:
        if request.log_name not in self.config.logs:
            from ..errors import ReplicationError

            raise ReplicationError(f"endpoint {self.config.location!r} has no log {request.log_name!r}")
        return await self._source.read(request)

    async def _serve_watch(self) -> AsyncIterator[str]:
        q: asyncio.Queue[str] = asyncio.Queue(maxsize=1000)
        self._watchers.add(q)
        try:
            for name in self.config.logs:  # a new watcher may have missed changes: read once
                yield name
            while True:
                name = await q.get()
                yield name
        finally:
            self._watchers.discard(q)

    async def _stamp_loop(self) -> None:
        """Stamp local events soon after they commit (reads stamp too, so this only bounds lag)."""
        while True:
            await _wait(self._local_change, self.config.retry_delay)
            self._local_change.clear()
            try:
                async with self._gate.step():
                    for name in self.config.logs:
                        while await self.store.stamp(name) > 0:
                            pass
            except Exception as e:  # the database may be briefly away: try again next round
                log.warning("%s: stamping failed: %s", self.config.location, e)

    # -- pulling -------------------------------------------------------------------------------

    async def _watch_loop(self, conn: Connection, source: RemoteSource) -> None:
        while True:
            try:
                async for name in source.watch():
                    event = self._wake.get((conn.address, name))
                    if event is not None:
                        event.set()
            except Exception as e:
                log.debug("watch of %s ended: %s", conn.address, e)
            await asyncio.sleep(self.config.retry_delay)

    async def _pull_loop(self, conn: Connection, source: RemoteSource, log_name: str) -> None:
        key = (conn.address, log_name)
        wake, detector = self._wake[key], self._detectors[key]
        replicator = Replicator(
            self.store, source, log_name, batch_size=self.config.batch_size, application=self.config.application
        )
        try:
            await self._pull(replicator, conn, log_name, wake, detector)
        finally:
            await replicator.close()

    async def _pull(
        self, replicator: Replicator, conn: Connection, log_name: str, wake: asyncio.Event, detector: FailureDetector
    ) -> None:
        while True:
            wake.clear()
            try:
                async with self._gate.step():
                    out = await replicator.step()
                detector.success(time.monotonic())
                if replicator.source_location is not None:
                    self._remote_location[conn.address] = replicator.source_location
                if out.written or out.progress != replicator.started_at:
                    continue  # more may be waiting: read again at once
            except asyncio.CancelledError:
                raise
            except Exception as e:
                detector.failure(e)
                log.debug("%s: pull of %s from %s failed: %s", self.config.location, log_name, conn.address, e)
            await _wait(wake, self.config.retry_delay)

    # -- disaster recovery and deletion -------------------------------------------------------

    @property
    def recovering(self) -> bool:
        """True until a recovery this endpoint started with (or found unfinished) has completed:
        meanwhile it serves, but neither pulls nor stamps."""
        return not self._gate.is_open

    async def recover(self) -> dict[str, int]:
        """Rebuild this location's logs from its connections after its database was lost.

        Construct the endpoint with ``recover=True`` (``journal endpoint run --recover``), so
        that nothing is stamped or pulled before this runs; called on a running endpoint, it
        first waits for the pulls and stamping in progress to end and holds them back until it
        completes. Every connected endpoint must be reachable (else :class:`JournalUnavailable`:
        retry; the logs stay flagged, local writes refused, and this endpoint neither pulls nor
        stamps). The order is :mod:`.recovery`'s: logs flagged and the guard installed; log
        positions moved past what the peers hold of this location; everything pulled until
        caught up; invalid snapshots deleted; flag and guard gone. Local events written before
        the recovery are stamped after it. Returns the events recovered per log.
        """
        await self._gate.close()
        await self.store.begin_recovery(self.config.logs)
        infos = [await source.info() for source in self._sources]
        recovered = await recover_logs(self.store, self.config, self._sources, infos)
        self._gate.open()
        self._local_change.set()  # stamp what was written before and during the recovery
        return recovered

    async def delete(self, log_name: str, to_log_seq_nr: int, *, physically_after: Sequence[str] = ()) -> int:
        """Logically delete the log up to ``to_log_seq_nr`` (returns the position applied); with
        ``physically_after``, also remove the deleted events those locations have stored (the
        rest waits for a later call)."""
        applied = await self.store.delete_logically(log_name, to_log_seq_nr)
        if physically_after:
            await self.store.delete_physically(log_name, applied, physically_after)
        return applied

    # -- status --------------------------------------------------------------------------------

    async def info(self) -> dict[str, Any]:
        """This endpoint's status: logs with position, version vector and progress per source;
        connections with their availability per log."""
        logs = {}
        for name in self.config.logs:
            logs[name] = {
                "recovering": await self.store.recovering([name]),
                "log_seq_nr": await self.store.log_seq_nr(name),
                "version_vector": (await self.store.version_vector(name)).to_json(),
                "progress": await self.store.all_progress(name),
            }
        now = time.monotonic()
        conns = []
        for c in self.config.connections:
            per_log = {}
            for name in self.config.logs_of(c):
                d = self._detectors[(c.address, name)]
                age = None if d.last_success is None else round(now - d.last_success, 3)
                state = "unknown" if d.state is None else type(d.state).__name__.lower()
                causes = list(d.state.causes) if isinstance(d.state, Unavailable) else []
                per_log[name] = {
                    "state": state,
                    "causes": causes,  # those published with the state; recent: gathered since
                    "last_success_age": age,
                    "recent_causes": list(d.causes),
                }
            conns.append({"address": c.address, "location": self._remote_location.get(c.address), "logs": per_log})
        return {
            "location": self.config.location,
            "listen": self.config.listen,
            "application": {"name": self.config.application.name, "version": self.config.application.version},
            "logs": logs,
            "connections": conns,
        }


async def delete_at_location(
    config: EndpointConfig, log_name: str, to_log_seq_nr: int, *, physically_after: Sequence[str] = ()
) -> tuple[int, int]:
    """:meth:`ReplicationEndpoint.delete` without serving (``journal endpoint delete``): on the
    location's own database, beside its running endpoint. Local events not yet in the log are
    stamped first. Returns (logically deleted up to, physically deleted up to; 0 without
    ``physically_after``)."""
    if log_name not in config.logs:
        raise ConfigurationError(f"log {log_name!r} is not one of this endpoint's logs {list(config.logs)}")
    if to_log_seq_nr < 1:
        raise InvalidArgument(f"to_log_seq_nr must be >= 1, got {to_log_seq_nr}")
    async with open_journal(config.dsn, settings=JournalSettings.load(dsn=config.dsn), migrate=False) as journal:
        store = journal.backend.replication_store(config.location)  # UnsupportedOperation off PostgreSQL
        await store.ensure_log(log_name)
        while await store.stamp(log_name):
            pass
        applied = await store.delete_logically(log_name, to_log_seq_nr)
        physical = await store.delete_physically(log_name, applied, physically_after) if physically_after else 0
    return applied, physical


async def _wait(event: asyncio.Event, seconds: float) -> None:
    """Wait until ``event`` is set, at most ``seconds``. ``asyncio.timeout`` rather than
    ``asyncio.wait_for``: before Python 3.12 the latter can swallow a cancellation that arrives as
    its timeout fires, and a loop around it then never stops."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()
