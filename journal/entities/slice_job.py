"""A job over the live events of some entity types whose slices its members share through the same
leases as projection workers (the event router, the delivery scan).

Each member runs lease rounds (:meth:`~journal.backend.SliceLeases.rebalance`) every
``renew_interval``: live members split the slices into contiguous chunks; a member killed with -9
stops renewing and its leases expire after ``lease_ttl``, then the others take its chunk. For every
contiguous run of slices it holds, a member reads each entity type live over that run (a stream),
starting where the progress recorded for those slices says. Each event read goes to the job's
handler, which :meth:`Read.add`\\ s a unit for every piece of work it starts for it and
:meth:`SliceJob.complete`\\ s each unit when done; an event is done when all its units are.

Per stream an event's offset is committed only once it and every event read before it are done,
and the committed offsets are recorded per slice (heartbeat rows of the offset store: "every event
of the slice before this timestamp is done") every ``save_interval``, and at once for slices given
away. Whoever reads a slice next starts at its recorded timestamp: events not done are read again,
and so may some that were. So a handler must tolerate an event it has handled: the router's
destinations drop copies they hold, the delivery scan only looks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Self

from ..envelope import EventEnvelope
from ..ids import runs
from ..journal import Journal
from ..offsets import TimestampOffset
from .stream import TypeStreams

log = logging.getLogger("journal.entities")

Stream = tuple[str, int, int]
"""(entity type, first slice, last slice) of a stream."""


@dataclass(eq=False, slots=True)
class Read:
    """One event read by a stream, with its units of work not yet done."""

    stream: Stream
    offset: TimestampOffset
    remaining: int = 1  # the handler's own call, completed when it returns
    dropped: bool = field(default=False)

    def add(self, units: int = 1) -> None:
        """The handler started ``units`` more pieces of work for this event."""
        self.remaining += units


class Progress:
    """In-order completion per stream: an event's offset is committed only once it and every
    event read before it on the same stream are done, whatever order they finish in."""

    def __init__(self) -> None:
        self.offsets: dict[Stream, TimestampOffset] = {}
        self.dirty: set[Stream] = set()
        self._reads: dict[Stream, deque[Read]] = {}
        self.open = 0
        """Events read and not yet done."""

    def read(self, stream: Stream, offset: TimestampOffset) -> Read:
        r = Read(stream, offset)
        self._reads.setdefault(stream, deque()).append(r)
        self.open += 1
        return r

    def complete(self, r: Read) -> None:
        r.remaining -= 1
        if r.remaining > 0 or r.dropped:
            return
        q = self._reads[r.stream]
        while q and q[0].remaining <= 0:
            done = q.popleft()
            self.open -= 1
            self.offsets[done.stream] = done.offset
            self.dirty.add(done.stream)

    def drop(self, stream: Stream) -> None:
        """The stream stopped: its open reads no longer count (their work may still finish)."""
        for r in self._reads.pop(stream, deque()):
            r.dropped = True
            self.open -= 1
        self.offsets.pop(stream, None)


Handle = Callable[[EventEnvelope, Read], Awaitable[None]]


class SliceJob:
    """Use through the event router or the delivery scan (``start``/``stop``)."""

    def __init__(
        self,
        journal: Journal,
        name: str,
        entity_types: Sequence[str],
        handle: Handle,
        *,
        member_id: str | None = None,
        save_interval: float = 1.0,
        lease_ttl: float | None = None,
        renew_interval: float | None = None,
        max_in_flight: int = 2000,
        fallback: Callable[[str], TimestampOffset | None] = lambda entity_type: None,
    ) -> None:
        """``name``: the job's leases; its progress is kept per entity type as ``name|type``.
        ``fallback``: where to start an entity type's slices that have no progress recorded."""
        ps = journal.settings.projection
        self.journal = journal
        self.name = name
        self.entity_types = tuple(entity_types)
        self._handle = handle
        self.member_id = member_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.save_interval = save_interval
        self.renew_interval = renew_interval or ps.lease_renew_interval
        self.max_in_flight = max_in_flight
        self._fallback = fallback
        self.leases = journal.backend.slice_leases(name, self.member_id, lease_ttl or ps.lease_ttl)
        self.progress = Progress()
        self._streams: dict[tuple[int, int], TypeStreams] = {}
        self._room = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.error: BaseException | None = None

    @property
    def slices(self) -> list[tuple[int, int]]:
        """The runs of slices this member reads now."""
        return sorted(self._streams)

    async def start(self) -> None:
        await self.leases.join()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._rounds()), loop.create_task(self._save_periodically())]

    async def stop(self) -> None:
        """Stop reading, record what is done, give the leases up."""
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self._stop_runs(list(self._streams))
        try:
            await self.leases.leave(error=None if self.error is None else str(self.error))
        except Exception as e:  # the database may be away: the leases expire on their own
            log.warning("%s: leases not released (%s)", self.name, e)

    def fail(self, error: BaseException) -> None:
        """The job cannot go on (a handler found a configuration error): it stops reading."""
        if self.error is None:
            self.error = error
            log.error("%s stopped: %s", self.name, error)
            self._room.set()
            for t in self._tasks:
                t.cancel()
            for streams in self._streams.values():
                asyncio.get_running_loop().create_task(streams.stop())

    def complete(self, r: Read) -> None:
        """One unit of work of ``r`` is done."""
        self.progress.complete(r)
        self._room.set()

    async def save(self) -> None:
        """Record the committed offsets of the streams that moved, per slice."""
        dirty, self.progress.dirty = self.progress.dirty, set()
        by_type: dict[str, dict[int, TimestampOffset]] = {}
        for stream in dirty:
            offset = self.progress.offsets.get(stream)
            if offset is not None:
                entity_type, lo, hi = stream
                by_type.setdefault(entity_type, {}).update(dict.fromkeys(range(lo, hi + 1), offset))
        try:
            for entity_type, done in by_type.items():
                await self.leases.save_progress(self._key(entity_type), {s: o.timestamp for s, o in done.items()})
        except BaseException:
            self.progress.dirty |= dirty  # next time (a takeover re-reads a little more meanwhile)
            raise

    def _key(self, entity_type: str) -> str:
        return f"{self.name}|{entity_type}"

    async def _save_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.save_interval)
            try:
                await self.save()
            except Exception as e:
                log.warning("%s: progress not saved (%s)", self.name, e)

    async def _rounds(self) -> None:
        while True:
            try:
                held = await self.leases.rebalance(self._give_up)
                await self._follow(set(held))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the database may be away: the next round tries again
                log.warning("%s: lease round failed (%s)", self.name, e)
            await asyncio.sleep(self.renew_interval)

    async def _give_up(self, slices: set[int]) -> None:
        await self._stop_runs([r for r in self._streams if any(r[0] <= s <= r[1] for s in slices)])

    async def _follow(self, held: set[int]) -> None:
        wanted = runs(held)
        await self._stop_runs([r for r in self._streams if r not in wanted])
        for run in wanted:
            if run not in self._streams and self.error is None:
                await self._start_run(run)

    async def _start_run(self, run: tuple[int, int]) -> None:
        lo, hi = run
        offsets: dict[str, TimestampOffset] = {}
        for entity_type in self.entity_types:
            done = await self.leases.load_progress(self._key(entity_type), range(lo, hi + 1))
            fallback = self._fallback(entity_type)
            stamps = [done[s] if s in done else (fallback.timestamp if fallback else None) for s in range(lo, hi + 1)]
            if None not in stamps:
                offsets[entity_type] = TimestampOffset(min(s for s in stamps if s is not None))
        streams = TypeStreams(
            self.journal, self.entity_types, offsets, lambda env, offset: self._on_event(env, offset, run),
            name=f"{self.name} {lo}-{hi}", on_error=self.fail, track_offsets=False, slices=run,
        )  # fmt: skip
        self._streams[run] = streams
        streams.start()
        log.info("%s: %s reads slices %d-%d", self.name, self.member_id, lo, hi)

    async def _stop_runs(self, stopping: list[tuple[int, int]]) -> None:
        for run in stopping:
            await self._streams.pop(run).stop()
        if stopping:
            with contextlib.suppress(Exception):  # what is not saved is read again by the next owner
                await self.save()
            for run in stopping:
                for entity_type in self.entity_types:
                    self.progress.drop((entity_type, *run))
            self._room.set()

    async def _on_event(self, env: EventEnvelope, offset: TimestampOffset, run: tuple[int, int]) -> None:
        while self.progress.open >= self.max_in_flight and self.error is None:
            self._room.clear()
            await self._room.wait()
        if self.error is not None:
            raise self.error
        r = self.progress.read((env.entity_type, *run), offset)
        await self._handle(env, r)
        self.complete(r)


class OnSlices:
    """The surface the event router and the delivery scan share over their :class:`SliceJob`:
    its error and share of slices, ``start``/``stop``, ``async with``."""

    _job: SliceJob

    @property
    def error(self) -> BaseException | None:
        """Why it stopped on its own (a destination type that is not registered...)."""
        return self._job.error

    @property
    def slices(self) -> list[tuple[int, int]]:
        """The slice ranges it reads now (its share among the members of its id)."""
        return self._job.slices

    async def start(self) -> None:
        await self._job.start()

    async def stop(self) -> None:
        """Stop reading, record what is done, give the slices up."""
        await self._job.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def cancel_tasks(tasks: dict[str, asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait until they ended (their errors are theirs), then forget them."""
    running = list(tasks.values())
    for t in running:
        t.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    tasks.clear()
