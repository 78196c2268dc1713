"""Processor: consume a source entity type, write 0..n events per source event to a target pid.

Built on the by-persistence-id queries (the projection runner and slice queries were not on main
when this was written). Exactly-once output: the processor's progress (source pid -> last
processed seq_nr) is stored in the *metadata of the same persist call* as its output, with
``expected_seq_nr``, so output and progress commit together or not at all; a crash between
reading and writing re-reads the same source events and writes their output once. ``process``
must be deterministic (an event it maps to no output is simply re-evaluated after a crash).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..envelope import EventEnvelope
from ..ids import persistence_id_of, slice_for
from ..journal import Journal

PROGRESS_KEY = "processor_progress"


class Processor:
    """``await Processor(...).run_once()`` processes everything stored now; call it in a loop to follow."""

    def __init__(
        self,
        source: Journal,
        target: Journal,
        processor_id: str,
        entity_type: str,
        process: Callable[[EventEnvelope], Sequence[Any]],
        *,
        slice_range: tuple[int, int] = (0, 1023),
        batch_size: int = 100,
    ) -> None:
        self.source, self.target = source, target
        self.target_pid = persistence_id_of("processor", processor_id)
        self.entity_type = entity_type
        self.process = process
        self.slice_range = slice_range
        self.batch_size = batch_size
        self.progress: dict[str, int] = {}
        self._target_seq: int | None = None
        self._outputs: list[Any] = []
        self.before_write: Callable[[], None] = lambda: None  # test hook (crash injection)

    async def load_progress(self) -> dict[str, int]:
        """The progress stored with the processor's last write (empty when it never wrote)."""
        highest = await self.target.highest_seq_nr(self.target_pid)
        self._target_seq = highest
        self.progress = {}
        if highest:
            async for env in self.target.current_events_by_persistence_id(self.target_pid, highest, highest):
                meta = env.metadata if isinstance(env.metadata, dict) else {}
                self.progress = {k: int(v) for k, v in meta.get(PROGRESS_KEY, {}).items()}
        return dict(self.progress)

    async def run_once(self) -> int:
        """Process all source events stored now; return how many output events were written."""
        if self._target_seq is None:
            await self.load_progress()
        written = 0
        lo, hi = self.slice_range
        async for pid in self.source.current_persistence_ids(self.entity_type):
            if not lo <= slice_for(pid) <= hi:
                continue
            async for env in self.source.current_events_by_persistence_id(pid, self.progress.get(pid, 0) + 1):
                self._outputs.extend(self.process(env))
                self.progress[pid] = env.seq_nr
                if len(self._outputs) >= self.batch_size:
                    written += await self._flush()
        return written + await self._flush()

    async def _flush(self) -> int:
        if not self._outputs:
            return 0
        outs, self._outputs = self._outputs, []
        self.before_write()
        envs = await self.target.persist(
            self.target_pid, outs, expected_seq_nr=self._target_seq, metadata={PROGRESS_KEY: dict(self.progress)}
        )
        self._target_seq = envs[-1].seq_nr
        return len(envs)
