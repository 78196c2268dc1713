"""Wait until a projection has processed a write: read your own write.

A projection's offset transaction sends ``pg_notify`` on :func:`~projections.postgres_store.
offsets_channel` when it commits, naming the projection and the batch's (pid, seq_nr)s
(:func:`~projections.postgres_store.offsets_payload`). :class:`WriteWaits` holds one LISTEN
connection for any number of waits: each wait checks the offset store once (the write may be
processed already), then is settled by the notifications that name its events, without a query;
a batch too large to be listed has the waits of its projection check the store, one query for
all of them. A wait ends when the projection has stored
an offset at or beyond each persistence id's seq_nr of the write (an event the projection
skipped or dead-lettered counts: its offset moved past it), or returns False at its timeout.

The listening connection is watched: when it drops, it is opened again and every wait checks
once more (a notification sent meanwhile is lost, not its answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

import asyncpg

from journal import Journal
from journal.bulk import Written
from journal.envelope import EventEnvelope
from journal.errors import InvalidArgument, JournalUnavailable, NotProjected
from journal.ids import entity_type_of, slice_for, validate_name
from journal.offsets import NoOffset, SequenceOffset, TimestampOffset, TimeUUIDOffset
from journal.postgres import asyncpg_dsn, connect
from journal.settings import JournalSettings

from .management import require_known
from .postgres_store import ProjectionSql, offsets_channel

log = logging.getLogger("projections.waits")

AWrite = EventEnvelope | Written | Iterable[EventEnvelope | Written] | TimestampOffset
"""What a write returned: an envelope or the list ``persist`` returned, a part ``persist_many``
returned (:class:`~journal.bulk.Written`) or a list of them; or a
:class:`~journal.offsets.TimestampOffset` (a slice query's), whose ``seen`` names pids and seq_nrs."""


def targets_of(written: AWrite) -> dict[str, int]:
    """pid -> the highest seq_nr of ``written`` (what the projection must have processed)."""
    if isinstance(written, TimestampOffset):
        pairs: Iterable[tuple[str, int]] = written.seen.items()
    elif isinstance(written, EventEnvelope):
        pairs = [(written.persistence_id, written.seq_nr)]
    elif isinstance(written, Written):
        pairs = [(written.persistence_id, written.last_seq_nr)]
    elif isinstance(written, NoOffset | SequenceOffset | TimeUUIDOffset):
        raise InvalidArgument(
            f"a {type(written).__name__} names no persistence id: wait for the envelopes the write returned"
        )
    else:
        pairs = [(e.persistence_id, e.last_seq_nr if isinstance(e, Written) else e.seq_nr) for e in written]
    out: dict[str, int] = {}
    for pid, seq_nr in pairs:
        out[pid] = max(seq_nr, out.get(pid, 0))
    if not out:
        raise InvalidArgument("nothing to wait for: the write names no event")
    return out


@dataclass
class _Wait:
    remaining: dict[str, int]
    """pid -> seq_nr not yet known to be processed."""
    done: asyncio.Future[bool] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class WriteWaits:
    """Waits for writes to be processed by named projections, over one LISTEN connection.

    ``async with WriteWaits.open(journal) as waits: await waits.wait("cart-totals", envelopes)``.
    On an open journal over PostgreSQL the checks take connections of its pool (one pool per
    process); over settings with a DSN the waits open a small pool of their own.
    """

    def __init__(self, settings: JournalSettings, dsn: str, pool: asyncpg.Pool | None = None) -> None:
        self.settings = settings
        self._dsn = dsn
        self._pool = pool
        self._owns_pool = pool is None
        self.sql = ProjectionSql(settings.schema)
        self._channel = offsets_channel(settings.schema)
        self._listener: asyncpg.Connection | None = None
        self._opening = asyncio.Lock()
        self._waiting: dict[str, list[_Wait]] = {}
        self._checking: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._entity_types: dict[str, str] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @classmethod
    def open(cls, source: Journal | JournalSettings) -> WriteWaits:
        """Waits over an open journal on PostgreSQL (its pool), or over settings with a DSN."""
        if isinstance(source, JournalSettings):
            if source.connection.dsn is None:
                raise InvalidArgument("WriteWaits needs settings with a DSN")
            return cls(source, source.connection.dsn)
        dsn = source.settings.connection.dsn
        if dsn is None:
            raise InvalidArgument("WriteWaits needs a journal on PostgreSQL")
        return cls(source.settings, dsn, source.backend.shared_connections().pool)

    async def __aenter__(self) -> WriteWaits:
        await self._listening()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        for waits in self._waiting.values():
            for w in waits:
                if not w.done.done():
                    w.done.set_exception(JournalUnavailable("the write waits were closed"))
        for task in [*self._checking.values(), *self._tasks]:
            task.cancel()
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
            self._listener = None
        if self._owns_pool and self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def wait(self, name: str, written: AWrite, timeout: float) -> bool:  # noqa: ASYNC109 (False at it)
        """True once projection ``name`` has processed ``written``; False after ``timeout`` s.

        Raises:
            UnknownProjection: no projection ``name`` has run against this database.
            NotProjected: ``written`` holds events of another entity type than ``name`` processes.
            InvalidArgument: a bad name, an empty write or a negative timeout.
        """
        validate_name(name, "projection name")
        if timeout < 0:
            raise InvalidArgument(f"timeout must be at least 0, got {timeout}")
        targets = targets_of(written)
        await self._listening()
        await self._check_projection(name, targets)
        w = _Wait(dict(targets))
        self._waiting.setdefault(name, []).append(w)
        try:
            if await self._processed(name, targets):  # already (registered first: no notification missed)
                return True
            try:
                async with asyncio.timeout(timeout):
                    return await asyncio.shield(w.done)
            except TimeoutError:
                return False
        finally:
            if not w.done.done():
                w.done.cancel()  # a check still under way sets nothing on it
            waits = self._waiting.get(name, [])
            waits.remove(w)
            if not waits:
                self._waiting.pop(name, None)

    # -- checks --------------------------------------------------------------------------------

    async def _conn_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            self._pool = await asyncpg.create_pool(asyncpg_dsn(self._dsn), min_size=0, max_size=2)
        return self._pool

    async def _check_projection(self, name: str, targets: dict[str, int]) -> None:
        """Refuse a projection that does not exist, or events of another entity type than it
        processes (known once it has processed one; cached)."""
        if name not in self._entity_types:
            async with (await self._conn_pool()).acquire() as conn:
                if not await self.sql.is_known(conn, name):
                    await require_known(conn, self.sql, name)  # raises UnknownProjection, naming the known
                expected = await self.sql.projected_entity_type(conn, name)
            if expected is None:  # nothing processed yet: asked again by the next wait
                return
            self._entity_types[name] = expected
        expected = self._entity_types[name]
        for pid in targets:
            if entity_type_of(pid) != expected:
                raise NotProjected(
                    f"{pid!r} is not processed by projection {name!r}: it projects entity type {expected!r}"
                )

    def _schedule(self, name: str) -> None:
        """Check the waits of ``name`` now (again after the running check, when one runs)."""
        if name not in self._waiting:
            return
        running = self._checking.get(name)
        if running is not None and not running.done():
            self._again.add(name)
            return
        self._checking[name] = asyncio.create_task(self._check(name), name=f"write-waits {name}")

    async def _stored(self, name: str, pids: Iterable[str]) -> dict[str, int]:
        async with (await self._conn_pool()).acquire() as conn:
            return await self.sql.processed(conn, name, [(slice_for(p), p) for p in pids])

    async def _processed(self, name: str, targets: dict[str, int]) -> bool:
        got = await self._stored(name, targets)
        return all(got.get(p, 0) >= n for p, n in targets.items())

    async def _check(self, name: str) -> None:
        while True:
            self._again.discard(name)
            waits = [w for w in self._waiting.get(name, []) if not w.done.done()]
            if not waits:
                return
            try:
                got = await self._stored(name, {pid for w in waits for pid in w.remaining})
            except Exception as e:  # the database is gone: the waits learn it, not a log line
                for w in waits:
                    if not w.done.done():
                        w.done.set_exception(JournalUnavailable(f"waiting for projection {name!r}: {e}"))
                return
            for w in waits:
                if not w.done.done() and all(got.get(p, 0) >= n for p, n in w.remaining.items()):
                    w.done.set_result(True)
            if name not in self._again:
                return

    # -- the LISTEN connection ----------------------------------------------------------------

    async def _listening(self) -> None:
        if self._closed:
            raise JournalUnavailable("the write waits were closed")
        if self._listener is not None and not self._listener.is_closed():
            return
        async with self._opening:
            if self._listener is not None and not self._listener.is_closed():
                return
            conn = await connect(self._dsn, self.settings, what="listen for projection offsets")
            conn.add_termination_listener(self._lost)
            await conn.add_listener(self._channel, self._notified)
            self._listener = conn

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        """A batch committed: its rows settle the waits they cover (no query); a batch too large
        to list its rows has the waits of its projection check the store."""
        try:
            name, *rows = json.loads(str(payload))
        except ValueError:
            return
        if not rows:
            self._schedule(name)
            return
        stored = dict(rows[0])
        for w in self._waiting.get(name, ()):
            if w.done.done():
                continue
            for pid in [p for p, n in w.remaining.items() if stored.get(p, 0) >= n]:
                del w.remaining[pid]
            if not w.remaining:
                w.done.set_result(True)

    def _lost(self, _conn: object) -> None:
        """The listening connection dropped: listen again, then check every wait (what was
        notified meanwhile is lost)."""
        if self._closed:
            return
        log.warning("write waits: listening connection lost; listening again")
        task = asyncio.create_task(self._relisten())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relisten(self) -> None:
        try:
            await self._listening()
        except Exception as e:
            for waits in self._waiting.values():
                for w in waits:
                    if not w.done.done():
                        w.done.set_exception(JournalUnavailable(f"cannot listen for projection offsets: {e}"))
            return
        for name in list(self._waiting):
            self._schedule(name)


async def wait_processed(
    source: Journal | JournalSettings,
    name: str,
    written: AWrite,
    timeout: float,  # noqa: ASYNC109 (False at it)
) -> bool:
    """One wait (:meth:`WriteWaits.wait`) over a LISTEN connection of its own: a service that
    waits often keeps a :class:`WriteWaits` open instead."""
    async with WriteWaits.open(source) as waits:
        return await waits.wait(name, written, timeout)
