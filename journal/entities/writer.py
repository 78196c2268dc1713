"""Writers (Eventuate's EventsourcedWriter) on the projection runner.

A :class:`Writer` keeps its own progress next to what it writes (an external database, a target
journal): ``read(pids)`` loads the stored progress (pid -> last written seq_nr; resume at +1),
``write(events, progress)`` stores a batch and the new progress together. :class:`WriterHandler`
adapts it to the runner's *grouped* handler kind, so leases, slice distribution, gap filling and
retries come from the runner. The runner's reader keeps filling its queue while ``write`` runs,
so events arriving during a write go into the next batch; the runner's ``group_size`` /
``queue_size`` and the writer's ``batch_size`` bound memory.

Why this is exactly-once without a shared transaction: the runner commits its offsets only after
``write`` returned, so its offsets never run ahead of the writer; after a crash between the two
it re-delivers events the writer already stored, and the handler drops every event at or below
the writer's stored progress (re-read after any failed write). Nothing is re-written, nothing
skipped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from ..envelope import EventEnvelope
from ..errors import ConfigurationError
from ..ids import slice_for, validate_slice_range


class Writer(ABC):
    """Batch-updates a database that also stores the writer's progress."""

    batch_size: int = 1000
    """Replay batch size: at most this many events per :meth:`write` call."""

    @abstractmethod
    async def read(self, persistence_ids: Sequence[str]) -> Mapping[str, int]:
        """Stored progress of these pids: pid -> last written seq_nr (absent: nothing written)."""

    @abstractmethod
    async def write(self, events: Sequence[EventEnvelope], progress: Mapping[str, int]) -> None:
        """Store the effect of ``events`` and ``progress`` (pid -> new last seq_nr) atomically."""

    # hooks for stateful writers (see journal.entities.stateful); no-ops here

    async def before_batch(self) -> None:  # noqa: B027 (a hook: empty by design)
        """Called before each batch the handler gets (a stateful writer recovers here)."""

    def on_events(self, events: Sequence[EventEnvelope]) -> None:  # noqa: B027
        """Called with the fresh events of a :meth:`write`, just before it."""

    def on_write_failed(self) -> None:  # noqa: B027
        """Called when :meth:`write` raised (its outcome is unknown)."""


class WriterHandler:
    """A grouped projection handler (``async (conn, envelopes)``) that drives a :class:`Writer`.

    ``Worker(journal, settings, name, entity_type, WriterHandler(writer), "grouped")`` runs it.
    ``slice_range`` limits it to part of the entity type (other events are passed over).
    """

    def __init__(
        self, writer: Writer, *, slice_range: tuple[int, int] | None = None, max_cached_pids: int = 100_000
    ) -> None:
        if writer.batch_size < 1:
            raise ConfigurationError(f"writer batch_size must be >= 1, got {writer.batch_size}")
        if slice_range is not None:
            validate_slice_range(*slice_range)
        self.writer = writer
        self.slice_range = slice_range
        self.max_cached_pids = max_cached_pids
        self.progress: dict[str, int] = {}
        """pid -> last seq_nr the writer stored (a cache of what ``read`` returns)."""
        self.batches: list[int] = []
        """Sizes of the write() calls made (for tests and stats; the last 1000)."""
        self.skipped = 0
        """Envelopes dropped because the writer had already stored them (re-deliveries)."""

    def _wanted(self, env: EventEnvelope) -> bool:
        if self.slice_range is None:
            return True
        lo, hi = self.slice_range
        return lo <= slice_for(env.persistence_id) <= hi

    async def __call__(self, _conn: Any, envelopes: Sequence[EventEnvelope]) -> None:
        await self.writer.before_batch()
        envs = [e for e in envelopes if self._wanted(e)]
        unknown = sorted({e.persistence_id for e in envs} - self.progress.keys())
        if unknown:
            if len(self.progress) + len(unknown) > self.max_cached_pids:
                self.progress.clear()  # bounded memory: forgotten pids are read again
            stored = await self.writer.read(unknown)
            self.progress.update({p: int(stored.get(p, 0)) for p in unknown})
        fresh: list[EventEnvelope] = []
        seen = dict(self.progress)
        for e in envs:
            if e.seq_nr <= seen[e.persistence_id]:
                self.skipped += 1
                continue
            seen[e.persistence_id] = e.seq_nr
            fresh.append(e)
        size = self.writer.batch_size
        for i in range(0, len(fresh), size):
            chunk = fresh[i : i + size]
            new = {e.persistence_id: e.seq_nr for e in chunk}
            try:
                self.writer.on_events(chunk)
                await self.writer.write(chunk, new)
            except BaseException:
                self.writer.on_write_failed()
                for pid in {e.persistence_id for e in fresh}:  # outcome unknown: read it again
                    self.progress.pop(pid, None)
                raise
            self.progress.update(new)
            self.batches = [*self.batches[-999:], len(chunk)]
