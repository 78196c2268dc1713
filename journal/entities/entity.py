"""The entity base class: a command handler that decides, an event handler that applies.

``persist``/``persist_all`` only *collect* events while a command handler runs; the registry
writes them atomically when the handler returns, then runs the event handler for each, then the
``on_persisted`` callbacks, then replies. Collection goes through a context variable, so a call
from an event handler, a callback or another entity's command is refused with
:class:`PersistNotAllowed`.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Generic, TypeVar

from ..envelope import EventEnvelope
from ..errors import EntityError, InvalidArgument, PersistNotAllowed
from ..ids import persistence_id_of, validate_persistence_id
from ..upcasting import EventSeq
from ..vector_time import VectorTime
from .reliable import CONFIRMS_KEY, Bookkeeping, FollowUp
from .routing import destinations_of, route_marks, routed_from
from .snapshot_result import SnapshotResult

S = TypeVar("S")

Callback = Callable[[EventEnvelope], None]
CommandHandler = Callable[[Any], Any]


@dataclass
class Collected:
    """What one command handler asked for: events, their routes and callbacks, a snapshot; or,
    ``after_write``, what a persist handler (an ``on_persisted`` callback, an ``after_persist``
    reply) or ``on_recovery`` asked for: behaviour changes, unstashing, redelivery only."""

    owner: Entity[Any]
    after_write: bool = False
    events: list[Any] = field(default_factory=list)
    destinations: list[tuple[str, ...]] = field(default_factory=list)
    callbacks: list[Callback | None] = field(default_factory=list)
    snapshot: bool = False
    stash: bool = False
    unstash: bool = False
    behaviours: list[CommandHandler | None] = field(default_factory=list)
    """become (a handler) and unbecome (None) calls, applied in order if the handler succeeds."""
    marks: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Index in ``events`` -> metadata marks of that event (see :mod:`.reliable`)."""
    routed: dict[int, tuple[str, int]] = field(default_factory=dict)
    """Index in ``events`` -> (source pid, source seq_nr) of the routed copies (delivery.py)."""
    redeliver: bool = False
    """:meth:`Entity.redeliver_unconfirmed` was called."""
    as_of: int | None = None
    """:meth:`Entity.reply_as_of`: the seq_nr whose vector time a timed reply gets."""


_current: contextvars.ContextVar[Collected | None] = contextvars.ContextVar(
    "slice_journal_entity_command", default=None
)


@dataclass(frozen=True, slots=True)
class EventContext:
    """The event an event handler is applying: :attr:`Entity.current_event` inside ``on_event``."""

    envelope: EventEnvelope
    replay: bool
    """True while the entity recovers (replays stored events), False for an event just written."""

    @property
    def seq_nr(self) -> int:
        return self.envelope.seq_nr

    @property
    def emitter_id(self) -> str:
        """The persistence id of the entity that wrote the event."""
        return self.envelope.persistence_id

    @property
    def aggregate_id(self) -> str:
        """The emitter's aggregate id (its persistence id)."""
        return self.envelope.persistence_id

    @property
    def destinations(self) -> tuple[str, ...]:
        """The extra aggregate ids the event was routed to."""
        return destinations_of(self.envelope)

    @property
    def routed_from(self) -> tuple[str, int] | None:
        """(source pid, source seq_nr) when the event was routed here from another entity."""
        return routed_from(self.envelope)

    @property
    def vector_time(self) -> VectorTime:
        """The event's vector timestamp in the collaboration model: ``{emitter pid: seq_nr}``, plus
        ``{source pid: source seq_nr}`` for a routed copy (what a conditional request waits for)."""
        times = {self.envelope.persistence_id: self.envelope.seq_nr}
        source = routed_from(self.envelope)
        if source is not None:
            times[source[0]] = max(times.get(source[0], 0), source[1])
        return VectorTime(times)

    @property
    def db_timestamp(self) -> datetime:
        """The system timestamp the database gave the event."""
        return self.envelope.db_timestamp

    @property
    def writer(self) -> str:
        """The id of the journal instance that wrote the event."""
        return self.envelope.writer


class AfterPersist:
    """A reply computed once the command's events are written and applied."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn


def after_persist(fn: Callable[[], Any]) -> AfterPersist:
    """Return this from a command handler to reply with ``fn()`` evaluated on the updated state."""
    return AfterPersist(fn)


class Entity(Generic[S]):
    """Subclass and implement :meth:`initial_state`, :meth:`on_command` and :meth:`on_event`.

    Class attributes: ``entity_type`` (required: the pid prefix), and optional overrides of the
    registry's settings: ``state_sync``, ``snapshot_every``, ``redeliver_interval``,
    ``stash_timeout`` (0: none), ``replay_from_seq_nr``, ``tags``
    (stored with every event), ``event_types`` (dataclasses registered with the JSON serializer
    so replay rebuilds them).

    ``on_command`` may be sync or async and returns the reply (or :func:`after_persist`).
    ``on_event(state, event)`` must be sync and return the new state; it is the only place
    where state changes, so a failing command leaves the state as it was.
    """

    entity_type: ClassVar[str]
    state_sync: ClassVar[bool | None] = None
    snapshot_every: ClassVar[int | None] = None
    replay_from_seq_nr: ClassVar[int] = 1
    tags: ClassVar[tuple[str, ...]] = ()
    event_types: ClassVar[tuple[type, ...]] = ()
    redeliver_interval: ClassVar[float | None] = None
    stash_timeout: ClassVar[float | None] = None

    def __init__(self, entity_id: str) -> None:
        self.entity_id = entity_id
        self.persistence_id = validate_persistence_id(persistence_id_of(self.entity_type, entity_id))
        self.state: S = self.initial_state()
        self._seq_nr = 0
        self._behaviours: list[CommandHandler] = []
        self._event: EventContext | None = None
        self._book = Bookkeeping()

    # -- to implement ------------------------------------------------------------------------

    def initial_state(self) -> S:
        raise NotImplementedError

    def on_command(self, command: Any) -> Any:
        raise NotImplementedError

    def on_event(self, state: S, event: Any) -> S:
        raise NotImplementedError

    def on_recovery(self, error: Exception | None) -> None:
        """Called once recovery ends: ``error`` is None on success."""

    def snapshot_state(self) -> Any:
        """What :meth:`save_snapshot` stores (default: ``self.state``; must be serializable)."""
        return self.state

    def restore_snapshot(self, snapshot: Any) -> S:
        """Turn a stored snapshot back into state (default: the stored value itself)."""
        return snapshot  # type: ignore[no-any-return]

    def on_snapshot_saved(self, result: SnapshotResult) -> None:
        """Called when a snapshot save ends: ``result.error`` is None on success."""

    # -- inside an event handler ---------------------------------------------------------------

    def persist_on_event(self, event: Any, *, destinations: Sequence[str] = ()) -> None:
        """Persist ``event`` once, as a follow-up of the event ``on_event`` is applying.

        Only inside ``on_event``. Written right after the current write (before the next
        command); on replay the handler asks again, but a follow-up already in the journal is
        recognized (its metadata names its trigger) and not written again; one that is missing
        (the process died between the two writes) is written once recovery ends.
        """
        ctx = self._in_event_handler("persist_on_event")
        self._book.add_follow_up(FollowUp(ctx.seq_nr, event, _clean_destinations(destinations)))

    def deliver(self, delivery_id: str, message: Any, destination: str) -> None:
        """Deliver ``message`` to the destination named ``destination`` until confirmed.

        Only inside ``on_event``. The registry sends a :class:`~.reliable.Delivery` to the
        destination registered under that name (``EntityRegistry.add_destination``) at once for a
        new event, after recovery for a replayed one, and again every ``redeliver_interval``
        seconds until a command handler calls :meth:`persist_confirmation` with ``delivery_id``.
        """
        ctx = self._in_event_handler("deliver")
        for what, v in (("delivery_id", delivery_id), ("destination", destination)):
            if not isinstance(v, str) or not v:
                raise InvalidArgument(f"{what} must be a non-empty string, got {v!r}")
        self._book.add_delivery(delivery_id, destination, message, live=not ctx.replay, seq_nr=ctx.seq_nr)

    @property
    def unconfirmed(self) -> Mapping[str, Any]:
        """Delivery id -> message of the deliveries not confirmed yet."""
        return {d: u.message for d, u in self._book.unconfirmed.items()}

    def _in_event_handler(self, what: str) -> EventContext:
        if self._event is None:
            raise PersistNotAllowed(f"{what}() on {self.persistence_id!r} is only allowed inside its on_event")
        return self._event

    @property
    def current_event(self) -> EventContext:
        """The metadata of the event ``on_event`` is applying (sequence number, emitter and
        aggregate id, database timestamp, whether it is a replay).

        Raises:
            EntityError: read outside ``on_event``.
        """
        if self._event is None:
            raise EntityError(f"current_event of {self.persistence_id!r} is only available inside on_event")
        return self._event

    # -- inside a command handler --------------------------------------------------------------

    @property
    def sequence_nr(self) -> int:
        """The sequence number of the last event applied to ``state``."""
        return self._seq_nr

    def persist(
        self,
        event: Any,
        *,
        destinations: Sequence[str] = (),
        on_persisted: Callback | None = None,
    ) -> None:
        """Collect ``event``; it is written when the command handler returns.

        ``destinations``: extra aggregate ids the event is routed to, stored with the event
        (metadata ``{"destinations": {seq_nr: [...]}}``) so every replay routes it the same way.
        ``on_persisted(envelope)`` runs after the event handler, only if the write succeeded.
        """
        c = self._collector("persist")
        _refuse_if_stashed(c)
        c.events.append(event)
        c.destinations.append(_clean_destinations(destinations))
        c.callbacks.append(on_persisted)

    def persist_confirmation(self, event: Any, delivery_id: str, *, destinations: Sequence[str] = ()) -> None:
        """Persist ``event`` as the confirmation of ``delivery_id`` (see :meth:`deliver`): once it
        is written the delivery is never sent again, also after a restart."""
        if not isinstance(delivery_id, str) or not delivery_id:
            raise InvalidArgument(f"delivery_id must be a non-empty string, got {delivery_id!r}")
        c = self._collector("persist_confirmation")
        self.persist(event, destinations=destinations)
        c.marks[len(c.events) - 1] = {CONFIRMS_KEY: delivery_id}

    def persist_all(self, events: Sequence[Any], *, destinations: Sequence[str] = ()) -> None:
        """Collect several events, written in one atomic call with the command's other events."""
        if not isinstance(events, list | tuple):
            raise InvalidArgument(f"persist_all needs a list or tuple, got {type(events).__name__}")
        c = self._collector("persist_all")
        _refuse_if_stashed(c)
        d = _clean_destinations(destinations)
        for e in events:
            c.events.append(e)
            c.destinations.append(d)
            c.callbacks.append(None)

    def save_snapshot(self) -> None:
        """Save ``snapshot_state()`` once this command's events are written and applied."""
        self._collector("save_snapshot").snapshot = True

    # -- stashing and behaviour changes (inside a command handler) ------------------------------

    def stash(self) -> None:
        """Keep the current command for later, its reply pending, instead of handling it now.

        A stashed command is delivered again (to the command handler current then) after
        :meth:`unstash_all`; it fails with :class:`~journal.errors.StashTimeout` if it stays
        stashed longer than ``stash_timeout`` seconds. It cannot persist events itself.
        """
        c = self._collector("stash")
        if c.events:
            raise InvalidArgument("a command that persists events cannot be stashed")
        c.stash = True

    def unstash_all(self) -> None:
        """Deliver every stashed command again, in stash order, before any other command.

        In a command handler, in a persist handler (an ``on_persisted`` callback or an
        :func:`after_persist` reply) or in :meth:`on_recovery`; like :meth:`become`, it takes
        effect only once the command's events are written (at once for a command without
        events): a failed write leaves the stash as it was."""
        self._collector("unstash_all", after_write=True).unstash = True

    def become(self, handler: CommandHandler) -> None:
        """Handle the next commands with ``handler`` (sync or async, like :meth:`on_command`)
        until :meth:`unbecome`; becomes stack.

        In a command handler it takes effect once the command's events are written (at once
        for a command without events): a failed write leaves the behaviour as it was. In a
        persist handler (an ``on_persisted`` callback or an :func:`after_persist` reply), the
        Eventuate way, it takes effect right after it, on success only. In :meth:`on_recovery`
        it restores a behaviour from the recovered state (a recovered or restarted entity
        starts with :meth:`on_command`)."""
        if not callable(handler):
            raise InvalidArgument(f"become() needs a callable command handler, got {handler!r}")
        self._collector("become", after_write=True).behaviours.append(handler)

    def unbecome(self) -> None:
        """Go back to the command handler before the last :meth:`become` (no-op at the bottom);
        where and when as :meth:`become`."""
        self._collector("unbecome", after_write=True).behaviours.append(None)

    def redeliver_unconfirmed(self) -> None:
        """Deliver every unconfirmed delivery again now, without waiting for its next interval
        (Eventuate's ``redeliverUnconfirmed``); where and when as :meth:`become`."""
        self._collector("redeliver_unconfirmed", after_write=True).redeliver = True

    def reply_as_of(self, seq_nr: int) -> None:
        """Give this command's timed reply (``registry.ask_timed``) the vector time of this
        entity's event ``seq_nr`` instead of the latest one: for a command that repeats an
        earlier write (a deduplicated retry) and writes nothing, the time of that write, which
        a view or a routed destination does reach. Only in a command handler that persists
        nothing; ``seq_nr`` at most :attr:`sequence_nr`."""
        c = self._collector("reply_as_of")
        if isinstance(seq_nr, bool) or not isinstance(seq_nr, int) or not 0 <= seq_nr <= self._seq_nr:
            raise InvalidArgument(f"reply_as_of needs a seq_nr in 0..{self._seq_nr}, got {seq_nr!r}")
        c.as_of = seq_nr

    def current_command_handler(self) -> CommandHandler:
        """The handler the next command goes to: the last :meth:`become`, else :meth:`on_command`."""
        return self._behaviours[-1] if self._behaviours else self.on_command

    def _collector(self, what: str, *, after_write: bool = False) -> Collected:
        """The current handler's collection; ``after_write``: persist handlers and
        ``on_recovery`` may call it too."""
        c = _current.get()
        if c is None or c.owner is not self or (c.after_write and not after_write):
            where = "its own command or persist handler, or on_recovery" if after_write else "its own command handler"
            raise PersistNotAllowed(
                f"{what}() on {self.persistence_id!r} is only allowed in {where} "
                "(not from an event handler, another entity or outside a command)"
            )
        return c


def _refuse_if_stashed(c: Collected) -> None:
    if c.stash:
        raise InvalidArgument("a stashed command cannot persist events")


def apply_behaviours(
    entity: Entity[Any], changes: list[CommandHandler | None]
) -> tuple[tuple[CommandHandler, ...], tuple[CommandHandler, ...]]:
    """Apply a handler's become/unbecome calls, in order; returns the behaviours before and after."""
    before = tuple(entity._behaviours)
    for h in changes:
        if h is not None:
            entity._behaviours.append(h)
        elif entity._behaviours:
            entity._behaviours.pop()
    return before, tuple(entity._behaviours)


def undo_behaviours(entity: Entity[Any], before: tuple[CommandHandler, ...], after: tuple[CommandHandler, ...]) -> None:
    """A failed write undoes its command's become/unbecome calls, unless a later command changed
    the behaviour again (``state_sync = False``)."""
    if tuple(entity._behaviours) == after:
        entity._behaviours[:] = before


def _clean_destinations(destinations: Sequence[str]) -> tuple[str, ...]:
    if isinstance(destinations, str) or not isinstance(destinations, list | tuple):
        raise InvalidArgument("destinations must be a list or tuple of aggregate ids")
    for d in destinations:
        if not isinstance(d, str) or not d:
            raise InvalidArgument(f"destination aggregate ids must be non-empty strings, got {d!r}")
    return tuple(destinations)


def begin_command(
    owner: Entity[Any], *, after_write: bool = False
) -> tuple[Collected, contextvars.Token[Collected | None]]:
    """A command handler's context; ``after_write``: a persist handler's or ``on_recovery``'s."""
    c = Collected(owner, after_write=after_write)
    return c, _current.set(c)


def end_command(token: contextvars.Token[Collected | None]) -> None:
    _current.reset(token)


def outside_command() -> contextvars.Token[Collected | None]:
    """Mark the current context as not inside a command (while event handlers and callbacks run)."""
    return _current.set(None)


def apply_event(entity: Entity[S], envelope: EventEnvelope, *, replay: bool) -> None:
    """Run the event handler on a stored event with :attr:`Entity.current_event` set."""
    entity._book.observe(envelope)
    entity._event = EventContext(envelope, replay)
    try:
        event = envelope.event
        if type(event) is not EventSeq:
            entity.state = entity.on_event(entity.state, event)
        else:  # an old row an upcaster split: each of its events, in order
            for e in event:
                entity.state = entity.on_event(entity.state, e)
    finally:
        entity._event = None
    route_marks(entity).note(envelope)


def set_sequence_nr(entity: Entity[Any], seq_nr: int) -> None:
    entity._seq_nr = seq_nr


def bookkeeping(entity: Entity[Any]) -> Bookkeeping:
    """The entity's follow-ups and unconfirmed deliveries (for the cell and recovery)."""
    return entity._book
