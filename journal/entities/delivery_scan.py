"""The delivery scan: keeps every sender with unconfirmed deliveries running, also after a restart.

A sender redelivers while it is live in a registry; after the process restarts, nothing makes it
live again until it is addressed, and one that never is would never redeliver. The scan reads
the sender entity types live, their slices shared among the scans of its ``scan_id`` through the
same leases as projection workers (:mod:`.slice_job`), and for every event it reads makes sure
the sender runs (``registry.start``) until no delivery asked for by that event or an earlier one
of it is unconfirmed. Only then is the event done, so the recorded progress never passes an
event with a delivery still open: after a restart (or a takeover by another process's scan),
reading again from the recorded progress starts every sender that still owes a delivery. A
sender that is running already is only looked at.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

from ..envelope import EventEnvelope
from ..errors import InvalidArgument, JournalError
from ..ids import entity_id_of, entity_type_of
from .entity import Entity
from .registry import EntityRegistry
from .slice_job import OnSlices, Read, SliceJob, cancel_tasks

log = logging.getLogger("journal.entities")

SCAN_TYPE = "sj_delivery_scan"
"""``sj_delivery_scan|<scan_id>`` names the scans' leases (their progress: ``...|<entity type>``)."""


class DeliveryScan(OnSlices):
    """Use as ``async with DeliveryScan(registry, [Payment]):`` in every process that serves
    senders (the classes of entities that call ``deliver``)."""

    def __init__(
        self,
        registry: EntityRegistry,
        senders: Sequence[type[Entity[Any]]],
        *,
        scan_id: str = "deliveries",
        check_interval: float = 0.5,
        save_interval: float = 1.0,
        member_id: str | None = None,
        lease_ttl: float | None = None,
        renew_interval: float | None = None,
    ) -> None:
        """``check_interval``: seconds between looks at a sender that still owes a delivery."""
        if isinstance(senders, type) or not senders:
            raise InvalidArgument("senders must be a non-empty list of entity classes")
        if check_interval <= 0:
            raise InvalidArgument(f"check_interval must be > 0, got {check_interval!r}")
        self.registry = registry
        self._classes = {registry.register(cls).entity_type: cls for cls in senders}
        self.check_interval = check_interval
        self.started = 0
        """Senders this scan made run (or found running) because of an event it read."""
        self._waiting: dict[str, deque[tuple[int, Read]]] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._job = SliceJob(
            registry.journal, f"{SCAN_TYPE}|{scan_id}", sorted(self._classes), self._look,
            member_id=member_id, save_interval=save_interval, lease_ttl=lease_ttl,
            renew_interval=renew_interval,
        )  # fmt: skip

    async def stop(self) -> None:
        await cancel_tasks(self._watchers)
        await super().stop()

    async def _look(self, env: EventEnvelope, read: Read) -> None:
        pid = env.persistence_id
        read.add()
        self._waiting.setdefault(pid, deque()).append((env.seq_nr, read))
        if pid not in self._watchers:
            self._watchers[pid] = asyncio.get_running_loop().create_task(self._watch(pid), name=f"deliveries of {pid}")

    async def _watch(self, pid: str) -> None:
        """Run the sender until the deliveries of the events read are confirmed."""
        waiting = self._waiting[pid]
        cls = self._classes[entity_type_of(pid)]
        try:
            self.started += 1
            while waiting:
                try:
                    await self.registry.start(cls, entity_id_of(pid))
                except JournalError as e:  # recovery failed (the database may be away): later
                    log.warning("delivery scan: %s does not start (%s); trying again", pid, e)
                else:
                    lowest = self.registry.lowest_unconfirmed(pid)
                    while waiting and (lowest is None or waiting[0][0] < lowest):
                        self._job.complete(waiting.popleft()[1])
                if waiting:
                    await asyncio.sleep(self.check_interval)
        finally:
            del self._watchers[pid]
            with contextlib.suppress(KeyError):
                if not self._waiting[pid]:
                    del self._waiting[pid]
