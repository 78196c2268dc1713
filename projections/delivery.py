"""How a processor's accepted events reach the handler, and their offsets the store: one small
class per delivery mode, chosen once when the processor is made (:func:`delivery_for`).

- :class:`AtLeastOnce`: the handler alone on each event (a failure is the event's own), the
  offset rows flushed every ``at_least_once_every`` events or ``at_least_once_interval`` seconds;
- :class:`ExactlyOnce`: each event's handler and its offset rows in one transaction;
- :class:`Grouped`: a batch of events handed to the handler at once, with their offset rows, in
  one transaction.

Each is handed a validated batch (the accepted events, and heartbeats: slices whose stored
offset may move up to a timestamp) by :meth:`Delivery.deliver`, and told to store what is left
by :meth:`Delivery.stop`. Each works on any kind of offset rows
(:class:`~projections.offset_rows.OffsetRows`: a slice range's, a tag's), and sets poisoned
events aside through the processor's :class:`~projections.isolation.Isolation` when its
recovery strategy skips or dead-letters.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Any, Generic, Protocol, TypeVar

from journal import tracing
from journal.envelope import EventEnvelope
from journal.errors import DestinationRefused, EventsMissing, HandlerFailed, LeaseLost
from journal.settings import ProjectionSettings

from .handlers import Mode
from .isolation import Isolation
from .offset_rows import OffsetRows
from .recovery import Failures
from .sequencing import Sequencer
from .stats import Stats
from .transactions import TransactionRunner, Unit

log = logging.getLogger("projections.runner.delivery")
"""A child of the runner's logger: the runner's log level is its own too."""
R = TypeVar("R")
_db_timestamp = attrgetter("db_timestamp")
Body = Callable[[Any], Awaitable[None]]


class Delivery(Protocol):
    """What a processor hands its validated batches to."""

    batch_size: int
    """The most envelopes a batch holds."""

    async def deliver(self, accepted: Sequence[EventEnvelope], heartbeats: dict[int, datetime]) -> None:
        """Handle ``accepted`` and store their offsets (now, or with a later flush), with the
        ``heartbeats`` (slice -> timestamp below which it is done). Empty when no batch came."""
        ...

    async def stop(self) -> None:
        """The unit is handed over or stopped: store what is worth storing."""
        ...

    def close(self) -> None:
        """The processor ended, stopped or not (an error, a cancellation): nothing of the
        delivery runs on."""
        ...


@dataclass(frozen=True)
class Handling(Generic[R]):
    """What every delivery of one processor works with."""

    handler: Callable[..., Awaitable[None]]
    tx: TransactionRunner
    offsets: OffsetRows[R]
    stats: Stats
    tries: int
    """A handler's tries before its recovery strategy acts (:meth:`HandlerRecovery.tries`)."""
    isolation: Isolation[R] | None
    """Set when the recovery strategy skips or dead-letters poisoned events."""
    sequencer: Sequencer | None = None
    """Set under ``retry-and-dead-letter-sequenced``: the events of a held persistence id are
    parked behind its dead letter instead of handled (:mod:`.sequencing`)."""


def delivery_for(mode: Mode, handling: Handling[R], settings: ProjectionSettings) -> Delivery:
    """The delivery of a projection's ``mode``."""
    if mode == "at-least-once":
        return AtLeastOnce(handling, settings)
    if mode == "exactly-once":
        return ExactlyOnce(handling, settings)
    return Grouped(handling, settings)


def traced(body: Body, envs: Sequence[EventEnvelope], unit: Unit) -> Body:
    """``body`` in a ``projection.batch`` span linked to the writes of ``envs``, with one
    ``projection.handle`` span per envelope that carries its write's trace context, a child of
    that context: one trace from the command that wrote an event to its read model."""

    async def run(conn: Any) -> None:
        origins = [(e, tracing.context_of(e)) for e in envs]
        links = [tracing.link_to(ctx) for _, ctx in origins if ctx is not None]
        attributes = {"projection": unit.name, "slices": unit.key, "events": len(envs)}
        with tracing.span("projection.batch", links=links, attributes=attributes) as batch, ExitStack() as spans:
            for e, ctx in origins:
                if ctx is not None:
                    spans.enter_context(
                        tracing.span(
                            "projection.handle", parent=ctx, kind="CONSUMER", links=[tracing.link_to(batch)],
                            attributes={"projection": unit.name, "persistence_id": e.persistence_id,
                                        "seq_nr": e.seq_nr},
                        )
                    )  # fmt: skip
            await body(conn)

    return run


class AtLeastOnce(Generic[R]):
    """The handler alone on each event; the offset rows stored now and then, behind the handling:
    a flush's transaction runs while the next events are handled (at most one at a time)."""

    def __init__(self, h: Handling[R], settings: ProjectionSettings) -> None:
        self.h = h
        self.s = settings
        self.batch_size = settings.group_size
        self._unflushed = 0
        self._heartbeats: dict[int, datetime] = {}
        """The heartbeats the next flush stores."""
        self._last_flush = time.monotonic()
        self._storing: asyncio.Task[None] | None = None
        """The last flush's transaction (its offset rows being stored), until it is awaited."""

    async def deliver(self, accepted: Sequence[EventEnvelope], heartbeats: dict[int, datetime]) -> None:
        if self._storing is not None and self._storing.done():
            await self._stored()  # a flush that failed stops the processor here
        handler, seq = self.h.handler, self.h.sequencer
        held = await seq.ready() if seq is not None else None
        for env in accepted:
            if held and env.persistence_id in held and await self._parked(env):
                continue
            if tracing.ON:
                await self._retried(env, None)
                continue
            try:  # the success path: the handler alone, no closure or retry state per envelope
                await handler(env)
            except (LeaseLost, EventsMissing, DestinationRefused):
                raise
            except Exception as e:  # counts as the first try
                await self._retried(env, e)
        self._unflushed += len(accepted)
        self._heartbeats.update(heartbeats)
        await self._flush(force=False)

    async def _parked(self, env: EventEnvelope) -> bool:
        """``env``'s id is held: parked behind its dead letter (True), or found free (False)."""
        seq = self.h.sequencer
        assert seq is not None
        return await seq.park_alone(env, self.h.offsets, self.h.tries)

    async def _retried(self, env: EventEnvelope, first: Exception | None) -> None:
        """``env`` through the transaction runner's tries (after the ``first`` try's error, when
        the handler already ran once); a poisoned one parked when the recovery strategy isolates."""
        h = self.h

        async def once(_conn: Any) -> None:
            await h.handler(env)

        failures = Failures()
        body = once if not tracing.ON else traced(once, [env], h.tx.unit)
        try:
            if first is None:
                await h.tx.run(body, tries=h.tries, transactional=False, failures=failures)
            else:
                await h.tx.after_failure(first, body, tries=h.tries, failures=failures)
        except HandlerFailed:
            if h.isolation is None:
                raise
            await h.isolation.park(env, failures, h.offsets.empty())  # its offset goes with the next flush

    async def stop(self) -> None:
        await self._stored()
        if self.h.offsets.has_pending:
            await self._flush(force=True)
            await self._stored()

    def close(self) -> None:
        if self._storing is not None:  # the processor failed or was cancelled: its offsets trail
            self._storing.add_done_callback(_consume)
            self._storing.cancel()
            self._storing = None

    async def _flush(self, *, force: bool) -> None:
        """Start storing the offset rows of the events handled so far when due and the last
        flush's transaction has ended (while it runs, the rows of the next events gather for the
        flush after it; ``force``: wait for it). The events are handled whatever the outcome, so
        the validator knows them as processed at once; a flush that fails stops the processor,
        whose successor reads the stored offsets."""
        o, hb = self.h.offsets, self._heartbeats
        due = self._unflushed >= self.s.at_least_once_every or (
            time.monotonic() - self._last_flush >= self.s.at_least_once_interval
        )
        if not (force or due) or not (o.has_pending or hb):
            return
        if self._storing is not None and not (force or self._storing.done()):
            return
        await self._stored()
        rows = o.pending(hb)
        newest = o.newest_pending()
        o.committed(hb)
        self._storing = asyncio.create_task(self._store(rows, newest, self._unflushed))
        self._heartbeats = {}
        self._unflushed = 0
        self._last_flush = time.monotonic()

    async def _stored(self) -> None:
        """Wait for the last flush's transaction (its error raised here)."""
        storing, self._storing = self._storing, None
        if storing is not None:
            await storing

    async def _store(self, rows: R, newest: datetime | None, events: int) -> None:
        o = self.h.offsets

        async def stored(conn: Any) -> list[int]:
            return await o.store_fenced(conn, rows)

        await self.h.tx.run(_nothing, tries=self.h.tries, first=stored, committed=o.proof(rows))
        self.h.stats.committed(events, newest, key=self.h.tx.unit.key)


async def _nothing(_conn: Any) -> None:
    """The body of a flush: its offset rows are the transaction's first statement."""


def _consume(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("abandoned offset flush ended with %r", task.exception())


class _Transactional(ABC, Generic[R]):
    """The handler and the offset rows of a batch in one transaction (exactly-once, grouped)."""

    def __init__(self, h: Handling[R], settings: ProjectionSettings) -> None:
        self.h = h
        self.batch_size = settings.group_size
        self._parked = 0
        """Events of the batch being delivered parked behind a dead letter (not handled)."""

    @abstractmethod
    async def handle(self, conn: Any, envs: Sequence[EventEnvelope]) -> None:
        """Run the handler on ``envs`` in the transaction on ``conn``."""

    async def deliver(self, accepted: Sequence[EventEnvelope], heartbeats: dict[int, datetime]) -> None:
        if not accepted and not heartbeats:
            return
        h, o = self.h, self.h.offsets
        rows = o.pending(heartbeats)
        started = time.monotonic()
        parked = self._parked = 0
        if h.sequencer is not None:
            await h.sequencer.ready()
        try:
            if accepted and h.isolation is not None:
                parked = await h.isolation.commit(accepted, rows, self.commit)
            else:
                await self.commit(accepted, rows, h.tries)
        except BaseException:
            o.rolled_back()
            raise
        o.committed(heartbeats)
        newest = max(map(_db_timestamp, accepted), default=None)
        h.stats.committed(len(accepted) - parked - self._parked, newest, time.monotonic() - started, key=h.tx.unit.key)

    async def stop(self) -> None:
        heartbeats = self.h.offsets.at_stop()
        if not heartbeats:
            return
        try:
            await self.deliver([], heartbeats)
        except (LeaseLost, HandlerFailed) as e:  # a slice already moved on: its owner resumes as before
            log.debug("%s: position not stored at stop: %s", self.h.tx.who, e)

    def close(self) -> None:
        """Nothing runs beside a batch: its transaction ended when :meth:`deliver` returned."""

    async def commit(
        self, envs: Sequence[EventEnvelope], rows: R, tries: int, failures: Failures | None = None
    ) -> None:
        """One transaction: the offset ``rows`` (its first statement, behind the lease check),
        then the handler on ``envs``."""
        o, seq = self.h.offsets, self.h.sequencer

        async def stored(conn: Any) -> list[int]:
            return await o.store_fenced(conn, rows)

        async def body(conn: Any) -> None:
            handled = envs if seq is None or not envs else await seq.split(conn, envs)
            if handled:
                await self.handle(conn, handled)

        await self.h.tx.run(
            body if not tracing.ON else traced(body, envs, self.h.tx.unit), tries=tries, first=stored,
            committed=o.proof(rows), failures=failures,
        )  # fmt: skip
        if seq is not None:
            self._parked += seq.committed()


class ExactlyOnce(_Transactional[R]):
    """One event a batch: its handler (``handler(conn, env)``) and offset rows in one transaction
    (a gap replayed before it comes in the same transaction, each event handled in turn)."""

    def __init__(self, h: Handling[R], settings: ProjectionSettings) -> None:
        super().__init__(h, settings)
        self.batch_size = 1

    async def handle(self, conn: Any, envs: Sequence[EventEnvelope]) -> None:
        for env in envs:
            await self.h.handler(conn, env)


class Grouped(_Transactional[R]):
    """A batch of up to ``group_size`` events handed to the handler at once
    (``handler(conn, envs)``), with their offset rows, in one transaction."""

    async def handle(self, conn: Any, envs: Sequence[EventEnvelope]) -> None:
        await self.h.handler(conn, envs)
