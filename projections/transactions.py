"""The one transaction runner of a projection's processors: pool, slots, lease fence, settling
of a commit of unknown outcome, retries and backoff, in one place.

A processor hands it a body (the handler and the offset rows, on one connection) and says which
leases the transaction must still hold (``fence``: slice -> epoch, checked under a row lock
first, so a worker that lost a slice never commits for it; or ``first``: the offset rows'
statement that checks them itself, one round trip for both) and how to tell, on a fresh
connection, that a transaction whose COMMIT lost its answer did commit (``committed``). The
runner takes a transaction slot and a connection of the worker's pool (the journal's, lent
through the seam's :class:`~journal.backend.SharedConnections`, or the worker's own: see
:class:`Connections`), and:

- a database outage (no connection, the transaction's connection lost) is retried without limit
  and does not count as an attempt (:mod:`.outage`); a COMMIT cut off by one is settled first
  (:func:`journal.postgres.settle`, the writer's loop) and not run again when it committed;
- a handler's :class:`DestinationUnavailable` (its destination, a Kafka broker, does not answer)
  is waited out the same way, worded for its destination;
- a handler's :class:`DestinationRefused` (wrong credentials, an ACL) stops it at once: not
  retried, never a dead letter;
- a handler's own error is tried ``tries`` times with backoff, then :class:`HandlerFailed`;
- a stop request ends a wait between tries (:class:`LeaseLost`: the batch stays rolled back).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from journal.errors import DestinationRefused, DestinationUnavailable, EventsMissing, HandlerFailed, LeaseLost
from journal.postgres import LeaseSql, settle
from journal.serialization import SerializerRegistry
from journal.settings import ProjectionSettings
from journal.transaction_slots import TransactionSlots
from journal.waits import wait_set

from .outage import Outage, database_unavailable
from .recovery import Failures
from .stats import Stats

log = logging.getLogger("projections.runner.transactions")
"""A child of the runner's logger: the runner's log level is its own too."""
T = TypeVar("T")
FencedStore = Callable[[Any], Awaitable[list[int]]]
"""A transaction's first statement that checks its leases and stores its offset rows (nothing
when a lease is lost): the slices no longer ours (``OffsetRows.store_fenced``)."""


@dataclass(frozen=True)
class Connections:
    """Where a worker's processors run their transactions: the pool (the journal's, from the
    seam, or the worker's own), the slots that bound how many at once (a handler's reads of the
    journal need connections left over), and the pool's ``application_name`` (a server process
    of ours is told apart by it when a commit is settled)."""

    pool: Any
    slots: TransactionSlots
    application_name: str
    prelude: Callable[[Any], Awaitable[None]] | None = None
    """Run in every transaction after the lease fence, before the body: a versioned
    projection's ``SET LOCAL search_path`` to its version's schema (:mod:`.versions`)."""


@dataclass(frozen=True)
class Unit:
    """Whose transactions: the projection, the worker, and the unit of work (``0-1023``, ``tag:t``)."""

    name: str
    owner: str
    key: str


@dataclass(frozen=True)
class _Fence:
    """How a transaction checks its leases first: ``epochs`` alone, or by the statement ``first``."""

    epochs: dict[int, int] | None
    first: FencedStore | None


class _Backoffs:
    """The state of one batch's retries."""

    def __init__(self, first: float) -> None:
        self.handler = first
        self.outage = first
        self.attempts = 0
        self.unsure = False
        """The last COMMIT was sent and its answer lost: it may have committed."""
        self.server_pid = 0


class _Attempt:
    """How far one try got (``phase``), and the handler's own error if it raised."""

    def __init__(self) -> None:
        self.phase = "connect"
        self.handler_exc: BaseException | None = None
        self.conn_lost = False


class TransactionRunner:
    """Runs a processor's transactions and its reads of the database through outages."""

    def __init__(
        self, connections: Connections, unit: Unit, *, leases: LeaseSql, settings: ProjectionSettings,
        outage: Outage, stats: Stats, stopping: asyncio.Event, serializers: SerializerRegistry | None,
    ) -> None:  # fmt: skip
        self.c = connections
        self.unit = unit
        self.leases = leases
        self.s = settings
        self.outage = outage
        self.stats = stats
        self.stopping = stopping
        self.serializers = serializers

    @property
    def pool(self) -> Any:
        return self.c.pool

    @property
    def who(self) -> str:
        return f"{self.unit.name} {self.unit.key}"

    async def run(
        self,
        body: Callable[[Any], Awaitable[Any]],
        *,
        tries: int,
        transactional: bool = True,
        fence: dict[int, int] | None = None,
        first: FencedStore | None = None,
        committed: Callable[[Any], Awaitable[bool]] | None = None,
        failures: Failures | None = None,
    ) -> None:
        """Run ``body`` until it commits (``transactional``; else the body alone, every error
        its own): each handler error noted in ``failures``, HandlerFailed after ``tries``. The
        transaction's first statement checks the leases of ``fence``, or is ``first`` (the
        offset rows stored behind the same check, before the body)."""
        if not transactional:
            # the first try runs the body alone, without the loop's objects (most tries succeed)
            try:
                await body(None)
                return
            except (LeaseLost, EventsMissing, DestinationRefused):
                raise
            except Exception as e:
                await self.after_failure(e, body, tries=tries, failures=failures)
                return
        state = _Backoffs(self.s.handler_backoff)
        await self._until_done(body, state, tries, transactional, _Fence(fence, first), committed, failures)

    async def after_failure(
        self, e: Exception, body: Callable[[Any], Awaitable[Any]], *, tries: int, failures: Failures | None
    ) -> None:
        """What :meth:`run` without a transaction does after its first try raised ``e`` (which
        counts as that try's): for a caller that made the first try itself (at-least-once calls
        the handler straight, with no closure, per envelope)."""
        state = _Backoffs(self.s.handler_backoff)
        first = _Attempt()
        first.phase, first.handler_exc = "handler", e
        await self._failed(e, first, state, tries, failures)
        await self._until_done(body, state, tries, False, _Fence(None, None), None, failures)

    async def _until_done(
        self, body: Callable[[Any], Awaitable[Any]], state: _Backoffs, tries: int, transactional: bool,
        fence: _Fence, committed: Callable[[Any], Awaitable[bool]] | None, failures: Failures | None,
    ) -> None:  # fmt: skip
        while True:
            attempt = _Attempt()
            try:
                await self._try(body, attempt, state, transactional, fence, committed)
                return
            except (LeaseLost, EventsMissing, DestinationRefused, asyncio.CancelledError):
                raise  # a refusal stops the projection: not retried, never a dead letter
            except DestinationUnavailable as e:  # an outage of the handler's destination: not counted
                await self._wait_out(state, f"{self.who}, {attempt.phase}", e, e.destination)
            except Exception as e:
                await self._failed(e, attempt, state, tries, failures)

    async def _try(
        self, body: Callable[[Any], Awaitable[Any]], attempt: _Attempt, state: _Backoffs, transactional: bool,
        fence: _Fence, committed: Callable[[Any], Awaitable[bool]] | None,
    ) -> None:  # fmt: skip
        if not transactional:  # at-least-once: the handler alone, every error its own
            attempt.phase = "handler"
            try:
                await body(None)
            except Exception as e:
                attempt.handler_exc = e
                raise
            return
        async with self.c.slots, self.c.pool.acquire() as conn:
            if state.unsure and committed is not None:
                # outside a transaction: pg_stat_activity is read once per transaction
                await settle(conn, state.server_pid, self.c.application_name, poll=0.05, who=f"{self.who}: ")
                if await committed(conn):
                    log.info("%s: the batch committed before the connection was lost", self.who)
                    self.outage.answered()
                    return
            state.unsure = False
            state.server_pid = conn.get_server_pid()
            async with conn.transaction():
                attempt.phase = "fence"
                await self._fence(conn, fence)
                if self.c.prelude is not None:
                    await self.c.prelude(conn)
                attempt.phase = "handler"
                try:
                    await body(conn)
                except Exception as e:
                    attempt.handler_exc = e
                    attempt.conn_lost = conn.is_closed()  # asked before the pool takes it back
                    raise
                attempt.phase = "commit"
        self.outage.answered()

    async def _fence(self, conn: Any, fence: _Fence) -> None:
        """The transaction's first statement: the leases it commits under are still ours (with
        ``fence.first``: checked by the statement that stores the offset rows)."""
        if fence.first is not None:
            lost = await fence.first(conn)
        elif fence.epochs:
            lost = await self.leases.fence(conn, self.unit.name, self.unit.owner, fence.epochs)
        else:
            return
        if lost:
            raise LeaseLost(f"{self.unit.name}: slices {lost[:5]}... are no longer ours")

    async def _failed(
        self, e: Exception, attempt: _Attempt, state: _Backoffs, tries: int, failures: Failures | None
    ) -> None:
        """After a failed try: wait out an outage (not counted), or count the handler's error."""
        # a rollback that fails after the handler's error (the connection is gone) raises its
        # own error instead: that one is ours, not the handler's
        in_handler = attempt.phase == "handler" and e is attempt.handler_exc
        if database_unavailable(e, in_handler=in_handler, conn_lost=attempt.conn_lost):
            state.unsure = state.unsure or attempt.phase == "commit"
            await self._wait_out(state, f"{self.who}, {attempt.phase}", e, "database")
            return
        self.stats.retries += 1
        state.attempts += 1
        if failures is not None:
            failures.failed(e)
        if state.attempts >= tries:
            said = f"projection {self.unit.name!r} slices {self.unit.key}: batch failed {state.attempts} times, "
            said += "last error: "
            raise HandlerFailed(f"{said}{type(e).__name__}: {e}", stored=self._stored(said, e)) from e
        log.warning(
            "%s: batch failed (attempt %d/%d), rolled back, retrying in %.2fs: %s: %s",
            self.who, state.attempts, tries, state.handler, type(e).__name__, e,
        )  # fmt: skip
        await self.pause(state.handler, e)
        state.handler = min(state.handler * 2, self.s.handler_max_backoff)

    async def _wait_out(self, state: _Backoffs, what: str, e: BaseException, subject: str) -> None:
        """An outage (of the database or of the handler's destination): noted, then a pause."""
        self.outage.failed(what, e, subject)
        await self.pause(state.outage, e)
        state.outage = min(state.outage * 2, self.s.handler_max_backoff)

    def _stored(self, said: str, e: BaseException) -> str | None:
        """A HandlerFailed's text as stored for ``projections status``: without the handler's
        error message when the journal encrypts (it may quote the event; see docs/encryption.md)."""
        if self.serializers is None or not self.serializers.keyed:
            return None
        return f"{said}{type(e).__name__} (its message is in the worker's log, not stored: the journal encrypts)"

    async def pause(self, seconds: float, cause: BaseException) -> None:
        """Wait before a retry; a stop request ends the wait (the batch stays rolled back)."""
        if await wait_set(self.stopping, seconds):
            raise LeaseLost(f"{self.who}: stopping during retries (batch rolled back)") from cause

    async def read(self, what: str, op: Callable[[], Awaitable[T]]) -> T:
        """A read of ours (offsets, a pid's record, the journal), retried through any outage."""
        delay = self.s.handler_backoff
        while True:
            try:
                result = await op()
            except (LeaseLost, EventsMissing, asyncio.CancelledError):
                raise
            except Exception as e:
                if not database_unavailable(e):
                    raise
                self.outage.failed(f"{self.who}, {what}", e)
                await self.pause(delay, e)
                delay = min(delay * 2, self.s.handler_max_backoff)
                continue
            self.outage.answered()
            return result
