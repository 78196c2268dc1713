"""Stateful writers and processors (Eventuate's stateful EventsourcedWriter / StatefulProcessor).

A stateful writer keeps in-memory state derived from *every* event it consumed, not only from
the events after its stored progress. Before its first batch (and again after a failed write,
as Eventuate restarts the writer) it recovers: it replays the source events of its slice range
from the start through ``on_event``; events at or below its stored progress only rebuild state
(their effects are stored already), so state never counts an event twice and writes never
repeat. Run one worker per slice range (the state covers the range's events).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from ..envelope import EventEnvelope
from ..ids import validate_entity_type, validate_slice_range
from ..journal import Journal
from .processor import Processor
from .writer import Writer

S = TypeVar("S")

_PAGE = 1000
"""Source events read per progress lookup during recovery."""


async def _replay(
    source: Journal,
    entity_type: str,
    slice_range: tuple[int, int],
    read: Callable[[Sequence[str]], Any],
    handle: Callable[[EventEnvelope, int], None],
) -> None:
    """Every current source event in the range, in per-pid order, with its pid's stored progress."""
    progress: dict[str, int] = {}
    page: list[EventEnvelope] = []

    async def flush() -> None:
        unknown = sorted({e.persistence_id for e in page} - progress.keys())
        if unknown:
            stored: Mapping[str, int] = await read(unknown)
            progress.update({p: int(stored.get(p, 0)) for p in unknown})
        for e in page:
            handle(e, progress[e.persistence_id])
        page.clear()

    async for env in source.current_events_by_slices(entity_type, *slice_range):
        page.append(env)
        if len(page) >= _PAGE:
            await flush()
    await flush()


class StatefulWriter(Writer, Generic[S]):
    """A :class:`Writer` with ``state``: implement :meth:`initial_state`, :meth:`on_event`, and
    ``read``/``write`` as for any writer (``write`` may use ``self.state``, which already covers
    the events it is given). Run it with ``WriterHandler(writer)`` like any writer."""

    def __init__(self, source: Journal, entity_type: str, slice_range: tuple[int, int] = (0, 1023)) -> None:
        self.source = source
        self.entity_type = validate_entity_type(entity_type)
        validate_slice_range(*slice_range)
        self.slice_range = slice_range
        self.state: S = self.initial_state()
        self.recovered = False
        self.replayed = 0
        """Events applied by the last recovery (for tests and stats)."""

    @abstractmethod
    def initial_state(self) -> S: ...

    @abstractmethod
    def on_event(self, state: S, envelope: EventEnvelope) -> S:
        """Return the new state (the only place state changes)."""

    async def recover(self) -> None:
        """Rebuild ``state`` from the events already written (those at or below the progress)."""
        self.state, self.replayed = self.initial_state(), 0

        def handle(env: EventEnvelope, stored: int) -> None:
            if env.seq_nr <= stored:
                self.state = self.on_event(self.state, env)
                self.replayed += 1

        await _replay(self.source, self.entity_type, self.slice_range, self.read, handle)
        self.recovered = True

    async def before_batch(self) -> None:
        if not self.recovered:
            await self.recover()

    def on_events(self, events: Sequence[EventEnvelope]) -> None:
        for e in events:
            self.state = self.on_event(self.state, e)

    def on_write_failed(self) -> None:
        self.recovered = False  # the state may hold events not written: rebuild it


class StatefulProcessor(Processor, Generic[S]):
    """A :class:`Processor` whose ``process(state, envelope)`` returns ``(new_state, outputs)``.

    Its progress is stored with its output (the last target row), so a source event that gave
    no output leaves no trace, and the runner may not deliver it again after a restart.
    Recovery therefore replays *every* current source event of the range: at or below the
    stored progress it only rebuilds state; after it, it processes and writes (catching up what
    a crash left unwritten). Events delivered again later are recognized and not applied twice.
    """

    def __init__(
        self,
        source: Journal,
        entity_type: str,
        target: Journal,
        processor_id: str,
        target_entity_type: str,
        process: Callable[[S, EventEnvelope], tuple[S, Sequence[Any]]],
        initial_state: Callable[[], S],
        *,
        slice_range: tuple[int, int] = (0, 1023),
        batch_size: int = 100,
    ) -> None:
        super().__init__(target, processor_id, target_entity_type, self._step, batch_size=batch_size)
        self.source = source
        self.entity_type = validate_entity_type(entity_type)
        validate_slice_range(*slice_range)
        self.slice_range = slice_range
        self._process = process
        self._initial = initial_state
        self.state: S = initial_state()
        self.applied: dict[str, int] = {}
        """Source pid -> last seq_nr applied to ``state``."""
        self.recovered = False
        self.replayed = 0

    def _step(self, env: EventEnvelope) -> Sequence[Any]:
        if env.seq_nr <= self.applied.get(env.persistence_id, 0):
            return ()  # applied (and its output written) already
        self.state, out = self._process(self.state, env)
        self.applied[env.persistence_id] = env.seq_nr
        return out

    async def recover(self) -> None:
        self.state, self.applied, self.replayed = self._initial(), {}, 0
        todo: list[EventEnvelope] = []

        def handle(env: EventEnvelope, stored: int) -> None:
            if env.seq_nr <= stored:
                self._step(env)  # its output is in the target already
                self.replayed += 1
            else:
                todo.append(env)

        await _replay(self.source, self.entity_type, self.slice_range, self.read, handle)
        for i in range(0, len(todo), self.batch_size):
            chunk = todo[i : i + self.batch_size]
            await self.write(chunk, {e.persistence_id: e.seq_nr for e in chunk})
        self.recovered = True

    async def before_batch(self) -> None:
        if not self.recovered:
            await self.recover()

    def on_write_failed(self) -> None:
        self.recovered = False
