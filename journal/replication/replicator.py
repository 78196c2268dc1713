"""The replication algorithm: a target pulls batches from a source log, one log and source at a time.

Kept free of the transport: a :class:`LogSource` is anything that answers a :class:`ReadRequest`
(the local store in tests, a gRPC client in an endpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Protocol

from .. import tracing
from ..backend import ReplicationStore
from ..replicated import ReplicationBatch, WriteOutcome
from ..vector_time import VectorTime
from .filters import EndpointFilters
from .versions import Application


@dataclass(frozen=True, slots=True)
class ReadRequest:
    """A target's read: events of ``log_name`` after ``after`` (those ``target_vv`` covers as
    identities only); or, with ``ids``, the events with those identities."""

    log_name: str
    after: int
    limit: int
    target_location: str
    target_vv: VectorTime = field(default_factory=VectorTime)
    target_application: Application = field(default_factory=Application)
    ids: tuple[tuple[str, int], ...] = ()
    stored: int | None = None
    """What the target has committed of this source's log (None: ``after``). A read ahead asks
    after a batch still being written; the source must not count that batch as stored (deferred
    physical deletion relies on it)."""


class LogSource(Protocol):
    """Where a target reads a source log from."""

    async def location(self) -> str: ...

    async def read(self, request: ReadRequest) -> ReplicationBatch: ...


class LocalSource:
    """The source side over a location's own store: stamp pending local events, then read."""

    def __init__(
        self,
        store: ReplicationStore,
        application: Application | None = None,
        filters: EndpointFilters | None = None,
    ) -> None:
        self.store = store
        self.application = application or Application()
        self.filters = filters or EndpointFilters()

    async def location(self) -> str:
        return self.store.location

    async def read(self, request: ReadRequest) -> ReplicationBatch:
        self.application.check_target(request.target_application, self.store.location, request.target_location)
        passes = self.filters.for_read(request.log_name, request.target_location)
        if request.ids:
            found = await self.store.read_ids(request.log_name, request.ids)
            found = [e for e in found if passes is None or passes(e)]
            return ReplicationBatch(self.store.location, request.log_name, tuple(found), request.after)
        await self.store.stamp(request.log_name)
        stored = request.after if request.stored is None else request.stored
        read = self.store.read_log(request.log_name, request.after, request.limit)
        if stored > 0:  # the target's progress recorded beside the read (its own connection)
            _, (events, last) = await asyncio.gather(
                self.store.record_target_progress(request.log_name, request.target_location, stored), read
            )
        else:
            events, last = await read
        if passes is not None:
            events = [e for e in events if passes(e)]
        send, covered = [], []
        for e in events:
            if e.vector_time <= request.target_vv:
                covered.append(e.event_id)
            else:
                send.append(e)
        return ReplicationBatch(self.store.location, request.log_name, tuple(send), last, tuple(covered))


class Replicator:
    """Pulls one log from one source into the target store; :meth:`step` moves one batch.

    While a batch is written, the next one is already read (one read ahead): the source's work
    and the target's overlap. The read ahead is used only if the progress it started from is
    what the write committed; call :meth:`close` when done with the replicator.
    """

    def __init__(
        self,
        target: ReplicationStore,
        source: LogSource,
        log_name: str,
        *,
        batch_size: int = 500,
        application: Application | None = None,
    ) -> None:
        self.target = target
        self.source = source
        self.log_name = log_name
        self.batch_size = batch_size
        self.application = application or Application()
        self.source_location: str | None = None
        self._ahead: tuple[int, asyncio.Task[ReplicationBatch]] | None = None
        self.started_at: int | None = None
        """The stored progress the last step started from (None before the first)."""

    def _request(self, after: int, vv: VectorTime, stored: int | None = None) -> ReadRequest:
        return ReadRequest(
            self.log_name, after, self.batch_size, self.target.location, vv, self.application, stored=stored
        )

    async def _read(self, after: int, vv: VectorTime) -> ReplicationBatch:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if ahead[0] == after:
                return await ahead[1]
            ahead[1].cancel()
        return await self.source.read(self._request(after, vv))

    async def step(self) -> WriteOutcome:
        """Read one batch after the stored progress and write it (with the progress) at once."""
        if tracing.ON:
            with tracing.span("replication.batch", attributes={"log": self.log_name}) as s:
                out = await self._step()
                s.set_attribute("written", out.written)
                return out
        return await self._step()

    async def _step(self) -> WriteOutcome:
        if self.source_location is None:
            self.source_location = await self.source.location()
        after, vv = await self.target.target_state(self.log_name, self.source_location)
        self.started_at = after
        try:
            batch = await self._read(after, vv)
            if not batch.events and not batch.covered and batch.last_scanned == after:
                return WriteOutcome(0, 0, after)
            self._ahead = (
                batch.last_scanned,
                asyncio.create_task(self.source.read(self._request(batch.last_scanned, vv, stored=after))),
            )
            events = list(batch.events)
            missing = await self.target.missing_ids(self.log_name, batch.covered)
            if missing:  # covered by the version vector, yet not stored here: a filter kept them from us
                extra = await self.source.read(
                    ReadRequest(self.log_name, after, len(missing), self.target.location, vv, self.application,
                                tuple(missing))
                )  # fmt: skip
                events = sorted([*events, *extra.events], key=lambda e: e.log_seq_nr)
            return await self.target.write_replicated(self.log_name, batch.source_location, events, batch.last_scanned)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Drop the read ahead, if any."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead[1].cancel()
            with contextlib.suppress(BaseException):
                await ahead[1]

    async def catch_up(self) -> int:
        """Steps until a batch brings nothing new; returns how many events were written."""
        written = 0
        try:
            while True:
                out = await self.step()
                written += out.written
                if out.written == 0 and out.progress == self.started_at:
                    return written
        finally:
            await self.close()
