"""Replicated entities: one entity accepting commands at several locations, converging everywhere.

Subclass :class:`ReplicatedEntity` (an event handler, optionally a conflict hook) and use
:class:`ReplicatedEntities` to write its events at this location and to load its state from every
event the location has (local and replicated), folded by :class:`~.conflicts.ConflictFold`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

from ..backend import ReplicationStore
from ..errors import SequenceConflict
from ..ids import persistence_id_of, validate_persistence_id
from ..journal import Journal
from ..upcasting import events_of
from ..vector_time import VectorTime
from .concurrent_versions import ConcurrentVersions, Version
from .conflicts import ConflictFold, Versioned

PERSIST_ATTEMPTS = 5
"""Writes of one persist call before a race with replicated batches is reported as SequenceConflict."""

S = TypeVar("S")


class ReplicatedEntity(Generic[S]):
    """``entity_type`` names the replicated log the entity's events belong to."""

    entity_type: ClassVar[str]

    def __init__(self, entity_id: str) -> None:
        self.entity_id = entity_id
        self.persistence_id = validate_persistence_id(persistence_id_of(self.entity_type, entity_id))

    def initial_state(self) -> S:
        raise NotImplementedError

    def on_event(self, state: S, event: Any) -> S:
        raise NotImplementedError

    def on_concurrent(self, state: S, event: Versioned, concurrent_with: Sequence[Versioned]) -> S:
        """Conflict hook for an event concurrent with ``concurrent_with`` (already applied).
        Default: apply it like any event (last writer wins by vector-time sum, then location)."""
        return self.on_event(state, event.event)


@dataclass(frozen=True, slots=True)
class ReplicatedState(Generic[S]):
    state: S
    vector_time: VectorTime
    """The merge of every event's vector time: what the entity has seen."""
    versions: tuple[Versioned, ...]
    """The events in fold order, each marked concurrent or not."""

    @property
    def concurrent(self) -> tuple[Versioned, ...]:
        return tuple(v for v in self.versions if v.concurrent)

    def concurrent_versions(self, value_of: Callable[[Any], Any] = lambda event: event) -> ConcurrentVersions:
        """The entity's events as versions of one value (``value_of(event)``, default the event):
        the versions no other event happened after, for the application to resolve."""
        return ConcurrentVersions(Version(value_of(v.event), v.vector_time, v.origin_location) for v in self.versions)


class ReplicatedEntities:
    """Write and load replicated entities at one location."""

    def __init__(self, journal: Journal, store: ReplicationStore) -> None:
        self.journal = journal
        self.store = store

    async def load(self, entity: ReplicatedEntity[S]) -> ReplicatedState[S]:
        """The entity's state from every stamped event of it at this location (stamps pending
        local events first, so the caller's own writes are included)."""
        await self.store.stamp(entity.entity_type)
        fold: ConflictFold[S] = ConflictFold(entity.initial_state, entity.on_event, entity.on_concurrent)
        serializers = self.journal.serializers
        pid = entity.persistence_id
        stored = await self.store.entity_events(pid)
        if serializers.keyed:
            _held = await serializers.load_keys((pid, ser.ser_id) for ser, *_ in stored)
        fold.add(
            Versioned(event, vt, origin, seq)
            for ser, origin, seq, vt in stored
            for event in events_of(serializers.deserialize(ser.ser_id, ser.manifest, ser.payload, what=pid, pid=pid))
        )
        return ReplicatedState(fold.state, fold.vector_time, tuple(fold.folded))

    async def persist(self, entity: ReplicatedEntity[S], events: Sequence[Any]) -> ReplicatedState[S]:
        """Write ``events`` at this location (after whatever it stored of the entity) and return
        the new state.

        Raises:
            LocalWritesRefused: the location is being recovered (``ReplicationEndpoint.recover``):
                its recovery guard refuses the write in the database, as it does every local write.
        """
        # The endpoint is a second writer of every replicated pid: a batch replicated from another
        # location may take the next sequence number between our read of the highest and our insert.
        # "After whatever is stored" is still well defined, so write again (bounded) after such a race.
        for attempt in range(1, PERSIST_ATTEMPTS + 1):
            try:
                await self.journal.persist(entity.persistence_id, list(events))
                break
            except SequenceConflict:
                if attempt == PERSIST_ATTEMPTS:
                    raise
        return await self.load(entity)
