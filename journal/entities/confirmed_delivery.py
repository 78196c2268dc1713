"""Confirmed delivery: sends an entity's unconfirmed messages until a confirmation is persisted.

The :class:`Deliverer` belongs to one live entity (its cell). A delivery asked for by an event
just written goes out at once; after recovery every unconfirmed delivery goes out; then each
unconfirmed delivery goes out again ``interval`` seconds after its previous attempt, until an
event that confirms it is applied (:meth:`Entity.persist_confirmation`). Destinations are named
callables registered on the registry, so a restarted sender finds them again by name.
Delivery is at-least-once: a destination must tolerate a message it already received.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .reliable import Bookkeeping, Delivery

log = logging.getLogger("journal.entities")

Destination = Callable[[Delivery], Awaitable[Any] | Any]
"""Receives a :class:`Delivery` (sync or async). Raising counts as not delivered (retried)."""


class Deliverer:
    """Runs one entity's deliveries. ``book`` returns the current instance's bookkeeping (a
    restarted entity is a new instance)."""

    def __init__(
        self,
        sender: str,
        book: Callable[[], Bookkeeping],
        destinations: Mapping[str, Destination],
        interval: float,
    ) -> None:
        self.sender = sender
        self._book = book
        self._destinations = destinations
        self.interval = interval
        self.attempts: dict[str, int] = {}
        """Delivery id -> attempts made by this cell (for tests and stats)."""
        self._last: dict[str, float] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._wake = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None

    @property
    def pending(self) -> bool:
        """True while some delivery is unconfirmed (the entity then stays in memory)."""
        return bool(self._book().unconfirmed)

    def recovered(self) -> None:
        """After (re)covery: send every unconfirmed delivery now, then keep the timer running."""
        self._last.clear()
        self._book().fresh = []
        self._wake.set()
        if self._timer is None or self._timer.done():
            self._timer = asyncio.get_running_loop().create_task(self._tick(), name=f"deliveries of {self.sender}")

    def redeliver_now(self) -> None:
        """Every unconfirmed delivery goes out again now (those in flight when their attempt
        returns), then every ``interval`` again."""
        self._last.clear()
        self._wake.set()

    def send_fresh(self) -> None:
        """Send the deliveries that events just written asked for."""
        now = time.monotonic()
        for d in self._book().take_fresh():
            self._send(d, now)
        self._wake.set()

    async def stop(self) -> None:
        tasks = [t for t in (self._timer, *self._running.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()

    async def _tick(self) -> None:
        while True:
            unconfirmed = self._book().unconfirmed
            now = time.monotonic()
            for d in [d for d in self._last if d not in unconfirmed]:
                del self._last[d]
            due = [d for d in unconfirmed if now - self._last.get(d, -self.interval) >= self.interval]
            for d in due:
                self._send(d, now)
            waits = [self._last[d] + self.interval - now for d in unconfirmed if d in self._last]
            self._wake.clear()
            try:
                async with asyncio.timeout(max(0.0, min(waits)) if waits else None):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _send(self, delivery_id: str, now: float) -> None:
        running = self._running.get(delivery_id)
        if running is not None and not running.done():
            return  # the previous attempt has not returned yet
        book = self._book()
        u = book.unconfirmed.get(delivery_id)
        if u is None:
            return
        self._last[delivery_id] = now
        if delivery_id in book.confirming:
            return  # its confirmation may be stored already: try again an interval later
        n = self.attempts.get(delivery_id, 0) + 1
        self.attempts[delivery_id] = n
        delivery = Delivery(delivery_id, self.sender, u.message, n)
        task = asyncio.get_running_loop().create_task(self._call(u.destination, delivery))
        self._running[delivery_id] = task
        task.add_done_callback(functools.partial(self._done, delivery_id))

    def _done(self, delivery_id: str, task: asyncio.Task[None]) -> None:
        if self._running.get(delivery_id) is task:
            del self._running[delivery_id]

    async def _call(self, name: str, delivery: Delivery) -> None:
        fn = self._destinations.get(name)
        if fn is None:
            log.warning("%s: no destination %r registered; retrying later", self.sender, name)
            return
        try:
            result = fn(delivery)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception(
                "delivery %s of %s to %r failed; retrying in %.1fs",
                delivery.delivery_id, self.sender, name, self.interval,
            )  # fmt: skip
