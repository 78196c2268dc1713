"""The isolation of poisoned events (``retry-and-skip``, ``retry-and-dead-letter``): a batch that
fails is committed half by half until the events its handler keeps failing on are alone, each
then tried again and set aside: skipped, or parked in ``projection_dead_letter``, in the
transaction that stores the offset rows that move past it (so exactly-once holds).

Used by the deliveries (:mod:`.delivery`) when the projection's recovery strategy isolates; it
knows nothing of the kind of offset rows (:class:`~projections.offset_rows.OffsetRows`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from journal.envelope import EventEnvelope
from journal.errors import HandlerFailed
from journal.serialization import SerializerRegistry

from .dead_letter_store import DeadLetter, DeadLetterSql, sealed
from .offset_rows import OffsetRows
from .recovery import Failures, HandlerRecovery
from .sequencing import Sequencer
from .stats import Stats
from .transactions import TransactionRunner

log = logging.getLogger("projections.runner.isolation")
"""A child of the runner's logger: the runner's log level is its own too."""
R = TypeVar("R")
Commit = Callable[[Sequence[EventEnvelope], R, int, Failures | None], Awaitable[None]]
"""One transaction of a delivery: the handler on the events and the offset rows, ``tries``
times, each failure noted in ``failures``."""


class Isolation(Generic[R]):
    """Sets a batch's poisoned events aside, the rest committed."""

    def __init__(
        self, recovery: HandlerRecovery, tx: TransactionRunner, offsets: OffsetRows[R], *, dead_letters: DeadLetterSql,
        stats: Stats, tries: int, serializers: SerializerRegistry | None, sequencer: Sequencer | None = None,
    ) -> None:  # fmt: skip
        self.dead = recovery.dead_letters
        self.sequencer = sequencer
        """Set under ``retry-and-dead-letter-sequenced``: told of each dead letter, so the later
        events of its persistence id are parked behind it."""
        self.tx = tx
        self.offsets = offsets
        self.dead_letters = dead_letters
        self.stats = stats
        self.tries = tries
        self.serializers = serializers
        """The journal's: a dead letter's error and traceback are sealed with the event's
        subject's key when it encrypts (:mod:`journal.sealed_text`)."""

    @classmethod
    def of(
        cls, recovery: HandlerRecovery, tx: TransactionRunner, offsets: OffsetRows[R], **kw: Any
    ) -> Isolation[R] | None:
        """The isolation of a projection whose strategy skips or dead-letters; else None."""
        return cls(recovery, tx, offsets, **kw) if recovery.isolates else None

    async def commit(self, envs: Sequence[EventEnvelope], rows: R, commit: Commit[R]) -> int:
        """The batch as one transaction; when it fails, halves committed on their own until the
        poisoned events are alone, each retried and then set aside. Returns how many were."""
        whole = Failures()
        try:
            await commit(envs, rows, 1 if len(envs) > 1 else self.tries, whole)
            return 0
        except HandlerFailed:
            if len(envs) == 1:
                await self.park(envs[0], whole, rows)
                return 1
        parked = await self._bisect(envs, commit)
        rest = self.offsets.rest(rows)
        if rest:
            await commit([], rest, self.tries, None)
        return parked

    async def _bisect(self, envs: Sequence[EventEnvelope], commit: Commit[R]) -> int:
        if len(envs) == 1:
            failures = Failures()
            rows = self.offsets.rows_of(envs)
            try:
                await commit(envs, rows, self.tries, failures)
                return 0
            except HandlerFailed:
                await self.park(envs[0], failures, rows)
                return 1
        parked = 0
        mid = len(envs) // 2
        for half in (envs[:mid], envs[mid:]):
            try:
                await commit(half, self.offsets.rows_of(half), 1, None)
                continue
            except HandlerFailed:
                pass
            # outside the except block: the handler's errors below are not chained to this
            # HandlerFailed (a dead letter's traceback held the chain once per level)
            parked += await self._bisect(half, commit)
        return parked

    async def park(self, env: EventEnvelope, failures: Failures, rows: R) -> None:
        """Set a poisoned event aside: its dead letter (``retry-and-dead-letter``) and the offset
        ``rows`` that move past it, in one transaction."""
        first, last = failures.first, failures.last
        assert first is not None and last is not None
        unit = self.tx.unit
        error, tb = failures.message, failures.traceback
        if self.dead and self.serializers is not None:
            error, tb = await sealed(self.serializers, env.persistence_id, error, tb)
        letter = DeadLetter(
            unit.name, env.persistence_id, env.seq_nr, env.slice, env.db_timestamp, error, tb, failures.attempts,
            first, last, unit.key,
        )  # fmt: skip

        async def body(conn: Any) -> None:
            if self.dead:
                await self.dead_letters.park(conn, letter)
            await self.offsets.store(conn, rows)

        o = self.offsets
        await self.tx.run(body, tries=self.tries, fence=o.fence(rows, env), committed=o.proof(rows))
        if self.dead:
            self.stats.dead_lettered += 1
            if self.sequencer is not None:
                self.sequencer.hold(env.persistence_id)
        else:
            self.stats.skipped += 1
        log.warning(
            "%s %s: %s %s #%d after %d attempts: %s", unit.name, unit.key,
            "dead-lettered" if self.dead else "skipped", env.persistence_id, env.seq_nr, failures.attempts,
            failures.message,
        )  # fmt: skip
