"""Processor: a :class:`Writer` whose database is a target journal (Eventuate's processor).

It consumes a source entity type through the projection runner (slice leases, offsets) and
writes the 0..n events ``process(envelope)`` returns for each source event. Output of source pid
``<type>|<id>`` goes to target pid ``<target_type>|<id>``, in source order. Idempotency without a
shared transaction (the journal writes through its own group-commit connections): every output
row carries ``{"processor": id, "source_seq_nr": n}`` in its metadata, written in the same atomic
part (one per target pid) of one ``persist_many`` call, with ``expected_seq_nr`` = the target
pid's highest as last read. So the progress is stored in the target journal, atomically with
the output; ``read`` recovers it from the last target row; a re-delivered source event at or
below it is dropped; a part racing another writer of the same target pid fails with
``SequenceConflict`` (nothing of it written) and the batch is retried after re-reading.
``process`` must be deterministic: a source event mapped to no output leaves no trace and is
simply evaluated again after a crash.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..bulk import Write, Written
from ..envelope import EventEnvelope
from ..errors import EntityError, JournalError
from ..ids import entity_id_of, persistence_id_of, validate_entity_type
from ..journal import Journal
from .writer import Writer

PROGRESS_KEY = "source_seq_nr"


class Processor(Writer):
    """Run it as ``Worker(source, settings, processor_id, entity_type, WriterHandler(p), "grouped")``."""

    def __init__(
        self,
        target: Journal,
        processor_id: str,
        target_entity_type: str,
        process: Callable[[EventEnvelope], Sequence[Any]],
        *,
        batch_size: int = 100,
    ) -> None:
        self.target = target
        self.processor_id = processor_id
        self.target_entity_type = validate_entity_type(target_entity_type)
        self.process = process
        self.batch_size = batch_size
        self.written = 0
        """Output events written by this instance."""
        self._target_seq: dict[str, int] = {}
        self.before_write: Callable[[], None] = lambda: None  # test hooks (crash injection)
        self.after_write: Callable[[], None] = lambda: None

    def target_pid(self, source_pid: str) -> str:
        return persistence_id_of(self.target_entity_type, entity_id_of(source_pid))

    async def _read_one(self, source_pid: str) -> int:
        tpid = self.target_pid(source_pid)
        highest = await self.target.highest_seq_nr(tpid)
        self._target_seq[source_pid] = highest
        if not highest:
            return 0
        env = await self.target.load_envelope(tpid, highest)
        meta = env.metadata if env is not None and isinstance(env.metadata, dict) else {}
        return int(meta.get(PROGRESS_KEY, 0))

    async def read(self, persistence_ids: Sequence[str]) -> Mapping[str, int]:
        done = await asyncio.gather(*(self._read_one(p) for p in persistence_ids))
        return dict(zip(persistence_ids, done, strict=True))

    async def write(self, events: Sequence[EventEnvelope], progress: Mapping[str, int]) -> None:
        outputs: dict[str, list[Any]] = {}
        for env in events:
            outputs.setdefault(env.persistence_id, []).extend(self.process(env))
        todo = {pid: outs for pid, outs in outputs.items() if outs}
        if not todo:
            return
        writes = []
        for source_pid, outs in todo.items():
            expected = self._target_seq.get(source_pid)
            if expected is None:
                raise EntityError(f"processor {self.processor_id!r}: write for {source_pid!r} before read()")
            meta = {"processor": self.processor_id, PROGRESS_KEY: progress[source_pid]}
            writes.append(Write(self.target_pid(source_pid), outs, expected, metadata=meta))
        self.before_write()
        try:
            # one bulk write: every target pid's part atomic on its own, all in a few statements
            outcomes = await self.target.persist_many(writes)
        except BaseException:
            for source_pid in todo:
                self._target_seq.pop(source_pid, None)
            raise
        error: JournalError | None = None
        for source_pid, out in zip(todo, outcomes, strict=True):
            if isinstance(out, Written):
                self._target_seq[source_pid] = out.last_seq_nr
                self.written += out.last_seq_nr - out.first_seq_nr + 1
            else:  # re-read before the runner retries the batch
                self._target_seq.pop(source_pid, None)
                error = error or out
        if error is not None:
            raise error
        self.after_write()
