"""Event routing: extra destination aggregate ids stored with the event, and the routed copies.

The journal keeps one metadata value per persist call, so routes are stored keyed by sequence
number: ``{"destinations": {"7": ["account|b"]}}``. Replays (by pid or by slices) carry the same
metadata, so :func:`destinations_of` and :func:`routed_to` answer the same way every time.

A routed copy (written into the destination by :class:`~journal.entities.router.EventRouter`)
is marked in the same metadata: ``{"routed": {"8": ["order|o1", 3]}}`` (seq_nr -> source pid
and seq_nr), and every write of an entity that ever received a routed copy carries its
cumulative ``"route_marks"`` (source pid -> highest source seq_nr routed into it so far). So the
last row of a pid always tells which routed events it holds: that is the per-source dedupe key,
read in the same single-writer step that writes the next copy (see router.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..envelope import EventEnvelope
from ..replication.vector_time import VectorTime

if TYPE_CHECKING:
    from ..journal import Journal


class _Emitter(Protocol):
    persistence_id: str

    @property
    def sequence_nr(self) -> int: ...


def routes_metadata(
    first_seq_nr: int,
    destinations: Sequence[tuple[str, ...]],
    routed: Mapping[int, tuple[str, int]] | None = None,
    marks: Mapping[str, int] | None = None,
) -> dict[str, Any] | None:
    """Metadata for one persist call (None when it carries nothing).

    ``routed``: index of an event in the call -> (source pid, source seq_nr) of a routed copy;
    ``marks``: the writer's cumulative route marks after this call.
    """
    meta: dict[str, Any] = {}
    routes = {str(first_seq_nr + i): list(d) for i, d in enumerate(destinations) if d}
    if routes:
        meta["destinations"] = routes
    if routed:
        meta["routed"] = {str(first_seq_nr + i): [s, n] for i, (s, n) in routed.items()}
    if marks:
        meta["route_marks"] = dict(marks)
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


def route_marks_of(envelope: EventEnvelope) -> dict[str, int]:
    """The cumulative route marks stored with this row's write (empty when none)."""
    marks = _section(envelope, "route_marks")
    if not isinstance(marks, dict):
        return {}
    return {str(k): int(v) for k, v in marks.items()}


class RouteMarks:
    """What one component has seen of routed events: source pid -> highest source seq_nr.

    Fed with every row the component applies (:meth:`note`); waiters (conditional requests) are
    woken on each change. ``last_seq_nr`` is the last own row noted, so a recovery that started
    from a snapshot can tell whether it still has to read the marks of the snapshot's row.
    """

    __slots__ = ("_waiters", "last_seq_nr", "marks")

    def __init__(self) -> None:
        self.marks: dict[str, int] = {}
        self.last_seq_nr = 0
        self._waiters: list[asyncio.Future[None]] = []

    def note(self, envelope: EventEnvelope) -> None:
        self.merge(route_marks_of(envelope))
        src = routed_from(envelope)
        if src is not None:
            self.merge({src[0]: src[1]})
        self.last_seq_nr = max(self.last_seq_nr, envelope.seq_nr)
        self.wake()

    def after(self, routed: Iterable[tuple[str, int]]) -> dict[str, int]:
        """The marks once ``routed`` (source pid, seq_nr) are written too (what a write stores)."""
        out = dict(self.marks)
        for pid, n in routed:
            if n > out.get(pid, 0):
                out[pid] = n
        return out

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


async def complete_route_marks(entity: _Emitter, journal: Journal) -> None:
    """After recovery: when no row was replayed up to the entity's seq_nr (a snapshot covered
    them), read the marks stored with that last row, so the dedupe knows every routed copy."""
    marks = route_marks(entity)
    seq = entity.sequence_nr
    if seq > marks.last_seq_nr:
        env = await journal.load_envelope(entity.persistence_id, seq)
        if env is not None:
            marks.merge(route_marks_of(env))
        marks.last_seq_nr = seq


def vector_time_of(entity: _Emitter) -> VectorTime:
    """The vector time of an entity's latest write: ``{pid: seq_nr}``."""
    return VectorTime({entity.persistence_id: entity.sequence_nr})


def seen_by(entity: _Emitter) -> dict[str, int]:
    """Everything an entity has seen: its own seq_nr and the marks of routed events it holds."""
    return {**route_marks(entity).marks, entity.persistence_id: entity.sequence_nr}
