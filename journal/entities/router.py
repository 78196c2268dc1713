"""The event router: delivers routed events into their destination entities, exactly once.

``persist(event, destinations=["account|b"])`` stores the destinations with the event
(routing.py). The router reads the source entity types live (one slice query per type, from its
durable offsets) and, for every event that names destinations, delivers a copy into each
destination entity through the :class:`EntityRegistry`: the destination's cell writes it as one
of the destination's own events (marked with the source pid and seq_nr) and runs the
destination's event handler on it. So the routed event becomes part of the destination's history:
its recovery replays it in the same place every time, views reading the destination see it, and
its snapshots cover it.

Why this is exactly once, in order per source, across restarts:

* In order: each destination has one queue, filled in the order the router reads (the journal's
  per-pid order) and written in that order, one batch (one atomic write) at a time.
* At least once: an event's offset becomes the router's offset only once the copies of it and of
  every event read before it are written (:class:`Progress`); the offsets are saved as the
  snapshot of pid ``sj_router|<router_id>`` every ``save_interval`` seconds and on stop. After a
  crash the router resumes from the last saved offsets and re-delivers what came after.
* At most once: a re-delivered copy is dropped by the destination (delivery.py): it knows the
  highest source seq_nr it holds per source (its route marks: every copy is marked with its
  source, snapshots store the marks, recovery rebuilds them), and the check and the write are
  one step of the pid's single writer
  (a concurrent writer makes the write fail with SequenceConflict; the entity restarts and the
  router re-sends).

Destinations are written concurrently (each destination's queue by its own task, at most
``max_batch`` events per write), with at most ``max_in_flight`` events read and not yet written.
Run one router per set of source types (a second one is harmless, only wasted work). Event types
of the sources must be registered in the router's process (entity classes or the serializer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ..envelope import EventEnvelope
from ..errors import ConfigurationError, InvalidArgument, JournalError
from ..ids import persistence_id_of
from ..offsets import TimestampOffset
from .delivery import RoutedEvent
from .registry import EntityRegistry
from .routing import destinations_of
from .stream import TypeStreams, offsets_from_json, offsets_to_json

log = logging.getLogger("journal.entities")

ROUTER_TYPE = "sj_router"
"""Entity type of the pids under which routers keep their offsets (as snapshots)."""


@dataclass(eq=False, slots=True)
class _Read:
    """One event read by a stream: its offset and how many destination copies are unwritten."""

    entity_type: str
    offset: TimestampOffset
    remaining: int


class Progress:
    """In-order completion per stream: an event's offset is committed only once it and every
    event read before it (on the same stream) are done, whatever order they finish in."""

    def __init__(self, offsets: dict[str, TimestampOffset]) -> None:
        self.offsets = offsets
        self._reads: dict[str, deque[_Read]] = {}
        self.open = 0
        """Events read and not yet done."""

    def read(self, entity_type: str, offset: TimestampOffset, copies: int) -> _Read:
        r = _Read(entity_type, offset, copies)
        self._reads.setdefault(entity_type, deque()).append(r)
        self.open += 1
        if copies == 0:
            self._advance(r)
        return r

    def written(self, r: _Read) -> bool:
        """One copy of ``r`` is written; True when that moved the committed offset."""
        r.remaining -= 1
        return r.remaining == 0 and self._advance(r)

    def _advance(self, r: _Read) -> bool:
        q = self._reads[r.entity_type]
        moved = False
        while q and q[0].remaining <= 0:
            done = q.popleft()
            self.open -= 1
            self.offsets[done.entity_type] = done.offset
            moved = True
        return moved


class EventRouter:
    """Use as ``async with EventRouter(registry, ["order"]) as router:`` (or start/stop)."""

    def __init__(
        self,
        registry: EntityRegistry,
        source_types: Sequence[str],
        *,
        router_id: str = "router",
        save_interval: float = 1.0,
        retry_delay: float = 0.5,
        max_batch: int = 100,
        max_in_flight: int = 2000,
    ) -> None:
        if isinstance(source_types, str) or not source_types:
            raise InvalidArgument("source_types must be a non-empty list of entity types")
        if save_interval <= 0 or retry_delay <= 0 or max_batch < 1 or max_in_flight < 1:
            raise ConfigurationError("save_interval and retry_delay must be > 0, max_batch and max_in_flight >= 1")
        self.registry = registry
        self.journal = registry.journal
        self.router_id = router_id
        self.pid = persistence_id_of(ROUTER_TYPE, router_id)
        self.save_interval = save_interval
        self.retry_delay = retry_delay
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.offsets: dict[str, TimestampOffset] = {}
        self.delivered = 0
        """Copies written into destinations by this instance."""
        self.duplicates = 0
        """Deliveries a destination dropped as already held (re-deliveries after a restart)."""
        self.retries = 0
        self._progress = Progress(self.offsets)
        self._streams = TypeStreams(
            self.journal,
            source_types,
            self.offsets,
            self._route,
            name=f"router {router_id}",
            on_error=self._failed,
            track_offsets=False,
        )
        self._queues: dict[str, deque[tuple[RoutedEvent, _Read]]] = {}
        self._senders: dict[str, asyncio.Task[None]] = {}
        self._room = asyncio.Event()
        self._error: BaseException | None = None
        self._saves = 0
        self._dirty = False
        self._saver: asyncio.Task[None] | None = None

    @property
    def error(self) -> BaseException | None:
        """Why the router stopped on its own (a destination type that is not registered...)."""
        return self._error or self._streams.error

    async def start(self) -> None:
        snap = await self.journal.load_snapshot(self.pid)
        if snap is not None and isinstance(snap.state, dict):
            self.offsets.update(offsets_from_json(snap.state.get("offsets")))
            self._saves = snap.seq_nr
        self._streams.start()
        self._saver = asyncio.get_running_loop().create_task(self._save_periodically())

    async def stop(self) -> None:
        """Stop reading and writing, then save the offsets of everything delivered."""
        await self._streams.stop()
        tasks = [*self._senders.values(), *([self._saver] if self._saver else [])]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._senders.clear()
        await self.save()

    async def __aenter__(self) -> EventRouter:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def save(self) -> None:
        """Store the offsets now (they cover only events whose copies are written)."""
        if not self._dirty:
            return
        self._dirty = False
        self._saves += 1
        try:
            await self.journal.save_snapshot(self.pid, self._saves, {"offsets": offsets_to_json(self.offsets)})
        except JournalError:
            self._dirty = True  # next time (a restart re-delivers a little more meanwhile)
            raise

    async def _save_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.save_interval)
            try:
                await self.save()
            except JournalError as e:
                log.warning("router %s: offsets not saved (%s)", self.router_id, e)

    def _failed(self, e: BaseException) -> None:
        log.error("router %s stopped: %s", self.router_id, e)

    async def _route(self, env: EventEnvelope, offset: TimestampOffset) -> None:
        while self._progress.open >= self.max_in_flight:
            self._room.clear()
            await self._room.wait()
        if self._error is not None:
            raise self._error
        dests = list(dict.fromkeys(destinations_of(env)))
        r = self._progress.read(env.entity_type, offset, len(dests))
        if not dests:
            self._dirty = True
            return
        routed = RoutedEvent(env.persistence_id, env.seq_nr, env.event)
        for d in dests:
            self._queues.setdefault(d, deque()).append((routed, r))
            sender = self._senders.get(d)
            if sender is None or sender.done():
                self._senders[d] = asyncio.get_running_loop().create_task(self._send(d), name=f"route to {d}")

    async def _send(self, destination: str) -> None:
        """Write ``destination``'s queue in order, a batch at a time, retrying transient errors."""
        q = self._queues[destination]
        while q:
            batch = [q[i] for i in range(min(self.max_batch, len(q)))]
            try:
                accepted = await self.registry.deliver_routed(destination, [e for e, _ in batch])
            except (ConfigurationError, InvalidArgument) as e:
                self._error = e
                self._room.set()
                log.error("router %s stopped: %s", self.router_id, e)
                await self._streams.stop()
                return
            except JournalError as e:
                self.retries += 1
                log.warning("router %s: delivery to %s failed (%s); retrying", self.router_id, destination, e)
                await asyncio.sleep(self.retry_delay)
                continue
            for _ in batch:
                q.popleft()
            self.delivered += accepted
            self.duplicates += len(batch) - accepted
            for _, r in batch:
                if self._progress.written(r):
                    self._dirty = True
            self._room.set()
        del self._queues[destination]
