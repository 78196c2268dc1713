"""One LISTEN connection per journal, fanned out to the live queries it concerns.

Payloads are ``"<slice // 64>:<entity_type>"`` (see :mod:`journal.postgres.statements`). A
subscription is woken when a notification names its entity type and a slice group overlapping its
range, and every subscription is woken after the listener (re)connects, since notifications sent
while it was not listening are lost (polling stays the safety net).
"""

from __future__ import annotations

import asyncio
import logging

from ..backend import SLICE_GROUP_SIZE, Listening, SliceQueryBackend

log = logging.getLogger("journal.query.notifications")


class Subscription:
    def __init__(self, hub: NotificationHub, entity_type: str, min_slice: int, max_slice: int) -> None:
        self.hub = hub
        self.entity_type = entity_type
        self.min_group = min_slice // SLICE_GROUP_SIZE
        self.max_group = max_slice // SLICE_GROUP_SIZE
        self.wake = asyncio.Event()
        self.woken_at = 0.0
        """Loop time of the last wake-up (a horizon reading must start after it)."""

    def matches(self, group: int, entity_type: str) -> bool:
        return entity_type == self.entity_type and self.min_group <= group <= self.max_group

    def notify(self) -> None:
        self.woken_at = asyncio.get_running_loop().time()
        self.wake.set()

    def close(self) -> None:
        self.hub.unsubscribe(self)


class NotificationHub:
    def __init__(self, backend: SliceQueryBackend) -> None:
        self._backend = backend
        self._subs: set[Subscription] = set()
        self._listening: Listening | None = None
        self._starting: asyncio.Lock = asyncio.Lock()
        self.received = 0

    async def subscribe(self, entity_type: str, min_slice: int, max_slice: int) -> Subscription:
        sub = Subscription(self, entity_type, min_slice, max_slice)
        self._subs.add(sub)
        async with self._starting:
            if self._listening is None:
                self._listening = await self._backend.listen(self._on_notify, self._on_reconnect)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subs.discard(sub)

    @property
    def listening(self) -> Listening | None:
        return self._listening

    def _on_notify(self, payload: str) -> None:
        self.received += 1
        group_text, _, entity_type = payload.partition(":")
        try:
            group = int(group_text)
        except ValueError:
            log.debug("ignoring notification %r", payload)
            return
        for sub in self._subs:
            if sub.matches(group, entity_type):
                sub.notify()

    def _on_reconnect(self) -> None:
        self.wake_all()

    def wake_all(self) -> None:
        for sub in list(self._subs):
            sub.notify()

    async def close(self) -> None:
        if self._listening is not None:
            await self._listening.close()
            self._listening = None
