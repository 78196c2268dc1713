"""The in-process registry: one live entity per persistence id, created on first command,
recovered from the journal, passivated after ``passivate_after`` seconds idle.

Only one registry per journal per process should serve a pid; a second *process* writing the
same pid is caught by the journal's :class:`SequenceConflict`, and the entity restarts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from ..errors import ConfigurationError, InvalidArgument, JournalUnavailable
from ..ids import entity_id_of, entity_type_of, validate_persistence_id
from ..journal import Journal
from ..settings import EntitySettings
from .cell import EntityCell
from .circuit_breaker import CircuitBreaker
from .conditional import TimedReply, as_vector_time, check_timeout, wait_until_seen
from .confirmed_delivery import Destination
from .delivery import RoutedDelivery, RoutedEvent
from .entity import Entity
from .routing import route_marks, seen_by

log = logging.getLogger("journal.entities")

E = TypeVar("E", bound=Entity[Any])


class EntityRegistry:
    """Routes commands to entities. Use as ``async with EntityRegistry(journal) as reg``."""

    def __init__(self, journal: Journal, settings: EntitySettings | None = None) -> None:
        self.journal = journal
        self.settings = settings or journal.settings.entities
        self.breaker = CircuitBreaker(self.settings.breaker_failures, self.settings.breaker_reset_timeout)
        self._types: dict[str, type[Entity[Any]]] = {}
        self._cells: dict[str, EntityCell] = {}
        self.destinations: dict[str, Destination] = {}
        """Name -> callable that entities' ``deliver`` calls reach (see :meth:`add_destination`)."""
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False
        self.passivations = 0

    def register(self, cls: type[E]) -> type[E]:
        """Make ``cls`` (an Entity subclass with ``entity_type``) known. Usable as a decorator."""
        et = getattr(cls, "entity_type", None)
        if not isinstance(cls, type) or not issubclass(cls, Entity) or not isinstance(et, str) or not et:
            raise ConfigurationError(f"{cls!r} must subclass Entity and set entity_type")
        if et in self._types and self._types[et] is not cls:
            raise ConfigurationError(f"entity type {et!r} is already registered to {self._types[et].__name__}")
        self._types[et] = cls
        for t in cls.event_types:
            self.journal.serializers.register_type(t)
        return cls

    def add_destination(self, name: str, destination: Destination) -> None:
        """Make ``destination`` (``fn(delivery)``, sync or async) reachable by ``Entity.deliver``
        under ``name``. Register it before the entities that deliver to it start; a delivery to
        a name not registered yet is retried at the next interval."""
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"destination name must be a non-empty string, got {name!r}")
        if not callable(destination):
            raise InvalidArgument(f"destination {name!r} must be callable, got {destination!r}")
        self.destinations[name] = destination

    async def start(self, cls: type[Entity[Any]], entity_id: str) -> None:
        """Recover the entity without sending it a command (e.g. at startup, so its unconfirmed
        deliveries and missing follow-ups resume). Raises :class:`RecoveryFailed`."""
        cell = self._cell(cls, entity_id)
        await cell.recovered.wait()
        if cell.failure is not None:
            raise cell.failure

    def lowest_unconfirmed(self, persistence_id: str) -> int | None:
        """The sequence number of the oldest event whose delivery the live entity ``persistence_id``
        has not seen confirmed; None when it has none, or is not live (an entity with unconfirmed
        deliveries is never passivated; start it first) or not recovered yet (then 0)."""
        cell = self._cells.get(persistence_id)
        if cell is None:
            return None
        if not cell.recovered.is_set():
            return 0
        return cell.unconfirmed_from()

    async def ask_pid(self, persistence_id: str, command: Any) -> Any:
        """:meth:`ask` by persistence id (e.g. to confirm a :class:`Delivery` to its ``sender``);
        the entity type must be registered."""
        cls = self._types.get(entity_type_of(persistence_id))  # "" without a separator: never registered
        if cls is None:
            raise InvalidArgument(f"no registered entity type for persistence id {persistence_id!r}")
        return await self.ask(cls, entity_id_of(persistence_id), command)

    async def ask(
        self,
        cls: type[Entity[Any]],
        entity_id: str,
        command: Any,
        *,
        after: Mapping[str, int] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (bounds the wait for ``after`` only)
    ) -> Any:
        """Send ``command`` to the entity and return its reply (or raise its error).

        ``after`` (a conditional request): a vector time (e.g. ``ask_timed(...).vector_time`` of
        another write); the command runs only once the entity has seen it (its own events and
        the routed events it received), waiting at most ``timeout`` seconds (default 10).

        Raises what the command handler raised; :class:`SequenceConflict` when another process
        wrote the pid first (the entity restarts from the journal; retrying is safe);
        :class:`RecoveryFailed`; :class:`JournalUnavailable` (``CircuitBreakerOpen`` at once
        while the breaker is open; ``outcome_unknown`` is never True: outcomes are resolved);
        :class:`ConditionTimeout` when ``after`` was not seen in time (the command did not run).
        """
        cell = await self._ready_cell(cls, entity_id, after, timeout)
        return await cell.submit(command)

    async def ask_timed(
        self,
        cls: type[Entity[Any]],
        entity_id: str,
        command: Any,
        *,
        after: Mapping[str, int] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (bounds the wait for ``after`` only)
    ) -> TimedReply[Any]:
        """:meth:`ask`, returning the reply with the vector time of the state it was computed on
        (after the command's events): pass ``.vector_time`` as ``after`` to a view or entity to
        read this write there. Raises as :meth:`ask`."""
        cell = await self._ready_cell(cls, entity_id, after, timeout)
        reply: TimedReply[Any] = await cell.submit(command, timed=True)
        return reply

    async def deliver_routed(self, destination: str, events: Sequence[RoutedEvent]) -> int:
        """Deliver routed events (in source order) to the entity ``destination`` (a pid of a
        registered entity type), exactly once: events it already holds are dropped. Returns how
        many were new. Used by :class:`~journal.entities.router.EventRouter`.

        Raises:
            ConfigurationError: no entity class is registered for the destination's type.
            JournalError: as :meth:`ask` (retrying is safe: copies already held are dropped).
        """
        validate_persistence_id(destination)
        cls = self._types.get(entity_type_of(destination))
        if cls is None:
            raise ConfigurationError(
                f"routed event for {destination!r}: no entity class registered for its entity type"
            )
        accepted: int = await self._cell(cls, entity_id_of(destination)).submit(RoutedDelivery(tuple(events)))
        return accepted

    async def _ready_cell(
        self, cls: type[Entity[Any]], entity_id: str, after: Mapping[str, int] | None, wait: float | None
    ) -> EntityCell:
        wanted = as_vector_time(after)
        limit = check_timeout(wait)
        cell = self._cell(cls, entity_id)
        if wanted:

            def seen() -> dict[str, int]:
                current = self._cells.get(cell.persistence_id, cell)
                return seen_by(current.entity) if current.recovered.is_set() else {}

            def changed(within: float) -> Any:
                return route_marks(self._cells.get(cell.persistence_id, cell).entity).changed(within)

            await wait_until_seen(cell.persistence_id, seen, changed, wanted, limit)
            cell = self._cell(cls, entity_id)  # passivated meanwhile: a fresh one
        return cell

    def _cell(self, cls: type[Entity[Any]], entity_id: str) -> EntityCell:
        if self._closed:
            raise JournalUnavailable("the entity registry is closed")
        if cls.entity_type not in self._types:
            self.register(cls)
        if not isinstance(entity_id, str) or not entity_id:
            raise InvalidArgument(f"entity id must be a non-empty string, got {entity_id!r}")
        pid = f"{cls.entity_type}|{entity_id}"
        cell = self._cells.get(pid)
        if cell is None:
            cell = EntityCell(
                cls, entity_id, self.journal, self.settings, self.breaker, self._stopped,
                self.destinations,
            )  # fmt: skip
            self._cells[pid] = cell
            self._ensure_reaper()
        return cell

    def is_active(self, cls: type[Entity[Any]], entity_id: str) -> bool:
        return f"{cls.entity_type}|{entity_id}" in self._cells

    @property
    def active_count(self) -> int:
        return len(self._cells)

    def _stopped(self, cell: EntityCell) -> None:
        if self._cells.get(cell.persistence_id) is cell:
            del self._cells[cell.persistence_id]

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        every = max(0.01, min(self.settings.passivate_after / 2, 5.0))
        while self._cells and not self._closed:
            await asyncio.sleep(every)
            await self.passivate_idle()

    async def passivate_idle(self, older_than: float | None = None) -> int:
        """Stop entities idle for ``older_than`` seconds (default ``passivate_after``)."""
        limit = self.settings.passivate_after if older_than is None else older_than
        now = time.monotonic()
        idle = [c for c in self._cells.values() if c.idle and now - c.last_used >= limit]
        for c in idle:
            self._stopped(c)  # new commands now create a fresh cell
        self.passivations += len(idle)
        await asyncio.gather(*(c.stop() for c in idle))
        return len(idle)

    async def close(self) -> None:
        """Finish queued commands and writes, then stop every entity."""
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        cells = list(self._cells.values())
        await asyncio.gather(*(c.stop() for c in cells))
        self._cells.clear()

    async def __aenter__(self) -> EntityRegistry:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
