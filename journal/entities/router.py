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

* In order: the router hands a source's events to a destination one after the other (the next
  only after the previous copy is written), in the journal's per-pid order.
* At least once: the router's offsets (saved as the snapshot of pid ``sj_router|<router_id>``,
  every ``save_interval`` seconds and on stop) only ever cover events whose copies are written;
  after a crash it resumes from the last saved offsets and re-delivers what came after.
* At most once: a re-delivered copy is dropped by the destination (delivery.py): each of its
  writes stores the highest source seq_nr it holds per source (``route_marks``), its recovery
  rebuilds those marks, and the check and the write are one step of the pid's single writer
  (a concurrent writer makes the write fail with SequenceConflict; the entity restarts and the
  router re-sends).

Run one router per set of source types (a second one is harmless, only wasted work). Event types
of the sources must be registered in the router's process (entity classes or the serializer).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

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
    ) -> None:
        if isinstance(source_types, str) or not source_types:
            raise InvalidArgument("source_types must be a non-empty list of entity types")
        if save_interval <= 0 or retry_delay <= 0:
            raise ConfigurationError("save_interval and retry_delay must be > 0")
        self.registry = registry
        self.journal = registry.journal
        self.router_id = router_id
        self.pid = persistence_id_of(ROUTER_TYPE, router_id)
        self.save_interval = save_interval
        self.retry_delay = retry_delay
        self.offsets: dict[str, TimestampOffset] = {}
        self.delivered = 0
        """Copies written into destinations by this instance."""
        self.duplicates = 0
        """Deliveries a destination dropped as already held (re-deliveries after a restart)."""
        self.retries = 0
        self._streams = TypeStreams(
            self.journal, source_types, self.offsets, self._route, name=f"router {router_id}", on_error=self._failed
        )
        self._saves = 0
        self._dirty = False
        self._saver: asyncio.Task[None] | None = None

    @property
    def error(self) -> BaseException | None:
        """Why the router stopped on its own (a destination type that is not registered...)."""
        return self._streams.error

    async def start(self) -> None:
        snap = await self.journal.load_snapshot(self.pid)
        if snap is not None and isinstance(snap.state, dict):
            self.offsets.update(offsets_from_json(snap.state.get("offsets")))
            self._saves = snap.seq_nr
        self._streams.start()
        self._saver = asyncio.get_running_loop().create_task(self._save_periodically())

    async def stop(self) -> None:
        """Stop reading, then save the offsets of everything delivered."""
        await self._streams.stop()
        if self._saver is not None:
            self._saver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._saver
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

    async def _route(self, env: EventEnvelope) -> None:
        dests = destinations_of(env)
        if dests:
            routed = [RoutedEvent(env.persistence_id, env.seq_nr, env.event)]
            pending = list(dict.fromkeys(dests))
            while pending:
                results = await asyncio.gather(
                    *(self.registry.deliver_routed(d, routed) for d in pending), return_exceptions=True
                )
                failed: list[str] = []
                for d, r in zip(pending, results, strict=True):
                    if isinstance(r, ConfigurationError | InvalidArgument):
                        raise r
                    if isinstance(r, BaseException):
                        if not isinstance(r, JournalError):
                            raise r
                        failed.append(d)
                        log.warning("router %s: delivery to %s failed (%s); retrying", self.router_id, d, r)
                    else:
                        self.delivered += r
                        self.duplicates += 1 - r
                pending = failed
                if pending:
                    self.retries += 1
                    await asyncio.sleep(self.retry_delay)  # stop() cancels it
        self._dirty = True
