"""Event-sourced views: read-only components that fold events into in-memory state and answer
queries (Eventuate's EventsourcedView).

A view subscribes to whole entity types (``entity_types``) and/or to single aggregates
(``aggregate_ids``: persistence ids, including the routed copies they receive). It reads them
live (one slice query per type, stream.py), applies each event once with ``on_event``, and answers
``ask(query)`` with ``on_query(state, query)``; ``ask(query, after=vector_time)`` waits until the
view has seen that vector time first (a conditional request, conditional.py).

Exactly once across restarts: the view remembers, per persistence id, the highest seq_nr it has
read (``positions``), drops anything at or below it, and a snapshot stores the state together
with the positions, the query offsets and the routed-event marks, all taken at one instant
between two events. A view restarted from that snapshot resumes the queries at those offsets,
so every event after the snapshot is applied once and none before it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, ClassVar, Generic, TypeVar

from ..envelope import EventEnvelope
from ..errors import ConfigurationError, EntityError
from ..ids import entity_type_of, persistence_id_of, validate_entity_type, validate_persistence_id
from ..journal import Journal
from ..offsets import TimestampOffset
from ..vector_time import VectorTime
from .conditional import as_vector_time, check_timeout, wait_until_seen
from .entity import EventContext
from .routing import RouteMarks
from .stream import TypeStreams, offsets_from_json, offsets_to_json

log = logging.getLogger("journal.entities")

S = TypeVar("S")

VIEW_TYPE = "sj_view"
"""Entity type of the pids under which views keep their snapshots."""


class View(Generic[S]):
    """Subclass and implement :meth:`initial_state`, :meth:`on_event` and :meth:`on_query`.

    Class attributes: ``view_id`` (names its snapshots), ``entity_types`` and/or
    ``aggregate_ids`` (what it reads), ``event_types`` (dataclasses registered with the JSON
    serializer), ``snapshot_every`` (save a snapshot every N applied events; 0: only
    :meth:`save_snapshot`). Run it with ``async with MyView(journal) as view:``.
    """

    view_id: ClassVar[str]
    entity_types: ClassVar[tuple[str, ...]] = ()
    aggregate_ids: ClassVar[tuple[str, ...]] = ()
    event_types: ClassVar[tuple[type, ...]] = ()
    snapshot_every: ClassVar[int] = 0

    def __init__(self, journal: Journal) -> None:
        view_id = getattr(self, "view_id", None)
        if not isinstance(view_id, str) or not view_id:
            raise ConfigurationError(f"{type(self).__name__} must set view_id")
        if not self.entity_types and not self.aggregate_ids:
            raise ConfigurationError(f"view {view_id!r} reads nothing: set entity_types or aggregate_ids")
        for a in self.aggregate_ids:
            if not entity_type_of(validate_persistence_id(a)):
                raise ConfigurationError(f"view {view_id!r}: aggregate id {a!r} has no entity type ('type|id')")
        self._types = frozenset(validate_entity_type(t) for t in self.entity_types)
        self._aggregates = frozenset(self.aggregate_ids)
        if self.snapshot_every < 0:
            raise ConfigurationError(f"view {view_id!r}: snapshot_every must be >= 0")
        self.journal = journal
        self.snapshot_pid = persistence_id_of(VIEW_TYPE, view_id)
        for t in self.event_types:
            journal.serializers.register_type(t)
        self.state: S = self.initial_state()
        self.applied = 0
        """Events applied to ``state`` (across restarts, when recovered from a snapshot)."""
        self.duplicates = 0
        """Events read again and dropped (at or below the stored position of their pid)."""
        self.positions: dict[str, int] = {}
        """pid -> highest seq_nr read (applied, or passed over as not subscribed)."""
        self._marks = RouteMarks()
        self._offsets: dict[str, TimestampOffset] = {}
        self._event: EventContext | None = None
        self._failure: BaseException | None = None
        self._snapshots: set[asyncio.Task[None]] = set()
        self._streams = TypeStreams(
            journal,
            self._types | {entity_type_of(a) for a in self._aggregates},
            self._offsets,
            self._read,
            name=f"view {view_id}",
            on_error=self._failed,
        )

    # -- to implement ----------------------------------------------------------------------------

    def initial_state(self) -> S:
        raise NotImplementedError

    def on_event(self, state: S, event: Any) -> S:
        raise NotImplementedError

    def on_query(self, state: S, query: Any) -> Any:
        raise NotImplementedError

    def snapshot_state(self) -> Any:
        """What a snapshot stores (default: ``self.state``; must be serializable)."""
        return self.state

    def restore_snapshot(self, snapshot: Any) -> S:
        """Turn a stored snapshot back into state (default: the stored value itself)."""
        return snapshot  # type: ignore[no-any-return]

    # -- inside on_event ---------------------------------------------------------------------------

    @property
    def current_event(self) -> EventContext:
        """The metadata of the event ``on_event`` is applying (EntityError elsewhere)."""
        if self._event is None:
            raise EntityError(f"current_event of view {self.view_id!r} is only available inside on_event")
        return self._event

    # -- running -----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover from the latest snapshot (if any), then read live from its offsets."""
        snap = await self.journal.load_snapshot(self.snapshot_pid)
        if snap is not None and isinstance(snap.metadata, dict):
            meta = snap.metadata
            self.state = self.restore_snapshot(snap.state)
            self._offsets.update(offsets_from_json(meta.get("offsets")))
            self.positions.update({str(k): int(v) for k, v in dict(meta.get("positions", {})).items()})
            self._marks.merge({str(k): int(v) for k, v in dict(meta.get("marks", {})).items()})
            self.applied = int(meta.get("applied", 0))
        self._streams.start()

    async def stop(self) -> None:
        await self._streams.stop()
        if self._snapshots:
            await asyncio.gather(*self._snapshots, return_exceptions=True)

    async def __aenter__(self) -> View[S]:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def vector_time(self) -> VectorTime:
        """What the view has seen: the position of every pid it read, merged with the sources
        of the routed copies it applied."""
        return VectorTime(self._seen())

    async def ask(
        self,
        query: Any,
        *,
        after: Mapping[str, int] | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 (bounds the wait for ``after``)
    ) -> Any:
        """Answer ``query`` from the current state; with ``after`` (a vector time, e.g. from
        :meth:`EntityRegistry.ask_timed`) only once the view has seen it.

        Raises:
            ConditionTimeout: ``after`` not seen within ``timeout`` seconds (default 10).
            EntityError: the view stopped because reading or an event handler failed.
            Exception: whatever ``on_query`` raises.
        """
        wanted = as_vector_time(after)
        limit = check_timeout(timeout)
        self._raise_if_failed()
        if wanted:
            await wait_until_seen(f"view {self.view_id!r}", self._seen, self._changed, wanted, limit)
        return self.on_query(self.state, query)

    async def save_snapshot(self) -> None:
        """Store the state with the positions and offsets it covers (taken now, written async)."""
        await self._write_snapshot(self._snapshot_now())

    # -- internals ---------------------------------------------------------------------------------

    def _seen(self) -> dict[str, int]:
        self._raise_if_failed()
        return {**self._marks.marks, **self.positions}

    async def _changed(self, within: float) -> None:
        await self._marks.changed(within)

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise EntityError(f"view {self.view_id!r} stopped: {self._failure}") from self._failure

    def _failed(self, e: BaseException) -> None:
        self._failure = e
        self._marks.wake()

    def _wants(self, env: EventEnvelope) -> bool:
        return env.entity_type in self._types or env.persistence_id in self._aggregates

    async def _read(self, env: EventEnvelope, _offset: TimestampOffset) -> None:
        pid = env.persistence_id
        if env.seq_nr <= self.positions.get(pid, 0):
            self.duplicates += 1
            return
        if self._wants(env):
            self._event = EventContext(env, False)
            try:
                self.state = self.on_event(self.state, env.event)
            finally:
                self._event = None
            self.applied += 1
            self.positions[pid] = env.seq_nr
            self._marks.note(env)
            if self.snapshot_every and self.applied % self.snapshot_every == 0:
                task = asyncio.get_running_loop().create_task(self._auto_snapshot(self._snapshot_now()))
                self._snapshots.add(task)
                task.add_done_callback(self._snapshots.discard)
        else:
            self.positions[pid] = env.seq_nr
            self._marks.wake()

    def _snapshot_now(self) -> tuple[int, Any, dict[str, Any]]:
        meta = {
            "offsets": offsets_to_json(self._offsets),
            "positions": dict(self.positions),
            "marks": dict(self._marks.marks),
            "applied": self.applied,
        }
        return sum(self.positions.values()), self.snapshot_state(), meta

    async def _auto_snapshot(self, snap: tuple[int, Any, dict[str, Any]]) -> None:
        try:
            await self._write_snapshot(snap)
        except Exception:
            pass  # logged; the next one may succeed

    async def _write_snapshot(self, snap: tuple[int, Any, dict[str, Any]]) -> None:
        seq_nr, state, meta = snap
        try:
            await self.journal.save_snapshot(self.snapshot_pid, seq_nr, state, metadata=meta)
        except Exception:
            log.exception("snapshot of view %s failed (a restart reads more events)", self.view_id)
            raise


__all__ = ["VIEW_TYPE", "View"]
