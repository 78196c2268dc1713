"""Event routing: extra destination aggregate ids stored with the event, and the routed copies.

The journal keeps one metadata value per persist call, so routes are stored keyed by sequence
number: ``{"destinations": {"7": ["account|b"]}}``. Replays (by pid or by slices) carry the same
metadata, so :func:`destinations_of` and :func:`routed_to` answer the same way every time.

A routed copy (written into the destination by :class:`~journal.entities.router.EventRouter`)
is marked in the same metadata: ``{"routed": {"8": ["order|o1", 3]}}`` (seq_nr -> source pid
and seq_nr). An entity's :class:`RouteMarks` (source pid -> highest source seq_nr it holds) are
rebuilt by its recovery: from its snapshot's metadata (``{"route_marks": {...}}``, saved with
the state) and the routed copies replayed after it. They are the per-source dedupe key, checked
in the same single-writer step that writes the next copy (see delivery.py). Rows never carry
the whole map, so a destination fed by many sources does not pay for it on every write.

An entity that skips history (``replay_from_seq_nr`` > 1) without a snapshot that covers the
skipped part does not know the routed copies in it: re-delivered, they would be written again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from ..envelope import EventEnvelope
from ..vector_time import VectorTime


class _Emitter(Protocol):
    persistence_id: str

    @property
    def sequence_nr(self) -> int: ...


def routes_metadata(
    first_seq_nr: int,
    destinations: Sequence[tuple[str, ...]],
    routed: Mapping[int, tuple[str, int]] | None = None,
) -> dict[str, Any] | None:
    """Metadata for one persist call (None when it carries nothing).

    ``routed``: index of an event in the call -> (source pid, source seq_nr) of a routed copy.
    """
    meta: dict[str, Any] = {}
    routes = {str(first_seq_nr + i): list(d) for i, d in enumerate(destinations) if d}
    if routes:
        meta["destinations"] = routes
    if routed:
        meta["routed"] = {str(first_seq_nr + i): [s, n] for i, (s, n) in routed.items()}
    return meta or None


def _section(envelope: EventEnvelope, key: str) -> Any:
    meta = envelope.metadata
    return meta.get(key) if isinstance(meta, dict) else None


def destinations_of(envelope: EventEnvelope) -> tuple[str, ...]:
    """The extra aggregate ids the event was routed to at persist time (may be empty)."""
    routes = _section(envelope, "destinations")
    if not isinstance(routes, dict):
        return ()
    return tuple(routes.get(str(envelope.seq_nr), ()))


def routed_to(envelope: EventEnvelope, aggregate_id: str) -> bool:
    """True when the event was emitted by ``aggregate_id`` (its pid) or routed to it."""
    return envelope.persistence_id == aggregate_id or aggregate_id in destinations_of(envelope)


def routed_from(envelope: EventEnvelope) -> tuple[str, int] | None:
    """(source pid, source seq_nr) when this row is a routed copy, else None."""
    routed = _section(envelope, "routed")
    if not isinstance(routed, dict):
        return None
    src = routed.get(str(envelope.seq_nr))
    if not isinstance(src, list) or len(src) != 2:
        return None
    return str(src[0]), int(src[1])


def snapshot_route_metadata(entity: object) -> dict[str, Any] | None:
    """What an entity's snapshot stores besides its state: its route marks (None when none)."""
    marks = route_marks(entity).marks
    return {"route_marks": dict(marks)} if marks else None


def restore_route_marks(entity: object, snapshot_metadata: Any) -> None:
    """Recovery restored the entity from a snapshot: take the route marks saved with it."""
    marks = snapshot_metadata.get("route_marks") if isinstance(snapshot_metadata, dict) else None
    if isinstance(marks, dict):
        route_marks(entity).merge({str(k): int(v) for k, v in marks.items()})


class RouteMarks:
    """What one component has seen of routed events: source pid -> highest source seq_nr.

    Fed with every row the component applies (:meth:`note`); waiters (conditional requests) are
    woken on each change.
    """

    __slots__ = ("_waiters", "marks")

    def __init__(self) -> None:
        self.marks: dict[str, int] = {}
        self._waiters: list[asyncio.Future[None]] = []

    def note(self, envelope: EventEnvelope) -> None:
        src = routed_from(envelope)
        if src is not None:
            self.merge({src[0]: src[1]})
        self.wake()

    def merge(self, marks: Mapping[str, int]) -> None:
        for pid, n in marks.items():
            if n > self.marks.get(pid, 0):
                self.marks[pid] = n

    def wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def changed(self, within: float) -> None:
        """Return after the next :meth:`note` (or after ``within`` seconds)."""
        w: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(w)
        await asyncio.wait([w], timeout=within)


def route_marks(component: object) -> RouteMarks:
    """The :class:`RouteMarks` of an entity instance (created on first use)."""
    found = vars(component).get("_route_marks")
    if found is None:
        found = RouteMarks()
        vars(component)["_route_marks"] = found
    assert isinstance(found, RouteMarks)
    return found


def vector_time_of(entity: _Emitter) -> VectorTime:
    """The vector time of an entity's latest write: ``{pid: seq_nr}``."""
    return VectorTime({entity.persistence_id: entity.sequence_nr})


def seen_by(entity: _Emitter) -> dict[str, int]:
    """Everything an entity has seen: its own seq_nr and the marks of routed events it holds."""
    return {**route_marks(entity).marks, entity.persistence_id: entity.sequence_nr}
