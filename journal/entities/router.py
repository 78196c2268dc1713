"""The event router: delivers routed events into their destination entities, exactly once.

``persist(event, destinations=["account|b"])`` stores the destinations with the event
(routing.py). The router reads the source entity types live and, for every event that names
destinations, delivers a copy into each destination entity through the :class:`EntityRegistry`:
the destination's cell writes it as one of the destination's own events (marked with the source
pid and seq_nr) and runs the destination's event handler on it. So the routed event becomes part
of the destination's history: its recovery replays it in the same place every time, views reading
the destination see it, and its snapshots cover it.

Routers with the same ``router_id`` share the slices of the source types through the same leases
as projection workers (:mod:`.slice_job`): start one per process, as many as you like; a router
that stops or is killed (-9) has its slices taken over by the others (after ``lease_ttl`` for a
killed one), and a router started later gets its share.

Why this is exactly once, in order per source, across restarts and takeovers:

* In order: a source pid is in one slice, read by one stream; each destination has one queue,
  filled in the order the router reads (the journal's per-pid order) and written in that order,
  one batch (one atomic write) at a time.
* At least once: an event is done once the copies of it are written, and a stream's progress
  moves only over events done along with every event read before them; it is recorded per slice
  every ``save_interval`` seconds, on stop and when slices are given away. Whoever reads a slice
  next (this router after a crash, another one after a takeover) starts at the recorded progress
  and delivers again what came after.
* At most once: a re-delivered copy is dropped by the destination (delivery.py): it knows the
  highest source seq_nr it holds per source (its route marks: every copy is marked with its
  source, snapshots store the marks, recovery rebuilds them), and the check and the write are
  one step of the pid's single writer (a concurrent writer, such as another router's registry
  during a takeover, makes the write fail with SequenceConflict; the entity restarts and the
  router re-sends). Two routers briefly reading the same slice deliver each source's events in
  the same order, so the marks still only grow.

Destinations are written concurrently (each destination's queue by its own task, at most
``max_batch`` events per write), with at most ``max_in_flight`` events read and not yet written.
Event types of the sources must be registered in the router's process (entity classes or the
serializer).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence

from ..envelope import EventEnvelope
from ..errors import ConfigurationError, InvalidArgument, JournalError
from ..ids import persistence_id_of, validate_entity_type
from ..offsets import TimestampOffset
from .delivery import RoutedEvent
from .registry import EntityRegistry
from .routing import destinations_of
from .slice_job import OnSlices, Read, SliceJob, cancel_tasks
from .stream import offsets_from_json

log = logging.getLogger("journal.entities")

ROUTER_TYPE = "sj_router"
"""``sj_router|<router_id>`` names the routers' leases (their progress: ``...|<source type>``), and
the snapshot pid where routers before slice leases kept their offsets (read once, as a start)."""


class EventRouter(OnSlices):
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
        member_id: str | None = None,
        lease_ttl: float | None = None,
        renew_interval: float | None = None,
    ) -> None:
        """``router_id`` names the routers that share the source types' slices (and their
        progress); ``member_id`` this one among them (default: host, process and a random part);
        ``lease_ttl`` and ``renew_interval`` default to the projection settings' lease values."""
        if isinstance(source_types, str) or not source_types:
            raise InvalidArgument("source_types must be a non-empty list of entity types")
        if save_interval <= 0 or retry_delay <= 0 or max_batch < 1 or max_in_flight < 1:
            raise ConfigurationError("save_interval and retry_delay must be > 0, max_batch and max_in_flight >= 1")
        self.registry = registry
        self.journal = registry.journal
        self.router_id = router_id
        self.pid = persistence_id_of(ROUTER_TYPE, router_id)
        self.retry_delay = retry_delay
        self.max_batch = max_batch
        self.source_types = tuple(sorted({validate_entity_type(t) for t in source_types}))
        self.delivered = 0
        """Copies written into destinations by this instance."""
        self.duplicates = 0
        """Deliveries a destination dropped as already held (re-deliveries after a restart)."""
        self.retries = 0
        self._legacy: dict[str, TimestampOffset] = {}
        self._job = SliceJob(
            self.journal, self.pid, self.source_types, self._route, member_id=member_id,
            save_interval=save_interval, lease_ttl=lease_ttl, renew_interval=renew_interval,
            max_in_flight=max_in_flight, fallback=self._legacy.get,
        )  # fmt: skip
        self._queues: dict[str, deque[tuple[RoutedEvent, Read]]] = {}
        self._senders: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        snap = await self.journal.load_snapshot(self.pid)  # offsets of a router before slice leases
        if snap is not None and isinstance(snap.state, dict):
            self._legacy.update(offsets_from_json(snap.state.get("offsets")))
        await super().start()

    async def stop(self) -> None:
        """Stop reading and writing, record what was delivered, give the slices up."""
        await cancel_tasks(self._senders)
        await super().stop()

    async def save(self) -> None:
        """Record the progress now (it covers only events whose copies are written)."""
        await self._job.save()

    async def _route(self, env: EventEnvelope, read: Read) -> None:
        dests = list(dict.fromkeys(destinations_of(env)))
        if not dests:
            return
        routed = RoutedEvent(env.persistence_id, env.seq_nr, env.event)
        for d in dests:
            read.add()
            self._queues.setdefault(d, deque()).append((routed, read))
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
                self._job.fail(e)
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
                self._job.complete(r)
        del self._queues[destination]
