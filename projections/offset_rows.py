"""The offset rows of a kind of processor, one small object each, composed into its deliveries.

A delivery (:mod:`.delivery`) and the isolation of poisoned events (:mod:`.isolation`) never
look inside the rows they store: they ask the processor's :class:`OffsetRows` for the rows of
what it accepted (``pending``), to store them in a transaction (``store``; ``store_fenced``: as
its first statement, behind the check of the leases it needs), which leases that transaction
must hold (``fence``), how to tell that a transaction whose COMMIT lost its answer
committed (``proof``), the rows of a few events alone (``rows_of``), and what of a batch's rows
is left once its events were committed or set aside half by half (``rest``).

- :class:`SliceOffsetRows`: a slice range's, a ``list[OffsetRow]`` in
  ``projection_timestamp_offset_store`` (per pid and heartbeat rows), its pending state the
  :class:`~projections.validation.Validator`'s overlay;
- :class:`TagOffsetRows`: a tag's, ``{pid: (seq_nr, TimeUUID)}`` in
  ``projection_tag_offset_store``, fenced by the tag's one lease.

Another source with timestamp offsets by slice (the changes of durable state by slices) stores
:class:`SliceOffsetRows` too; a source with offsets of its own kind brings a class of this shape.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar

from journal.envelope import EventEnvelope
from journal.offsets import TimeUUIDOffset
from journal.postgres import LeaseFence, LeaseSql

from .postgres_store import HEARTBEAT_PID, OffsetRow, ProjectionSql
from .tag_offset_store import TagOffsetSql
from .transactions import Unit
from .validation import Validator

R = TypeVar("R")
Proof = Callable[[Any], Awaitable[bool]]
"""Asked on a fresh connection when a COMMIT got no answer: did it commit?"""
TagRows = dict[str, tuple[int, uuid.UUID]]
"""A tag's offset rows: pid -> (seq_nr, TimeUUID offset) (``projection_tag_offset_store``)."""


class OffsetRows(Protocol[R]):
    """The offset rows ``R`` of one unit of work (a slice range, a tag) and their pending state."""

    @property
    def has_pending(self) -> bool:
        """Events were accepted since the last commit of their offsets."""
        ...

    def pending(self, heartbeats: dict[int, datetime]) -> R:
        """The rows of the events accepted since the last commit, and of ``heartbeats``
        (slice -> timestamp below which the slice is done)."""
        ...

    def newest_pending(self) -> datetime | None:
        """The newest timestamp among the pending rows (the lag a flush reports)."""
        ...

    def committed(self, heartbeats: dict[int, datetime]) -> None:
        """The pending rows (and ``heartbeats``) are stored: fold them into the known offsets."""
        ...

    def rolled_back(self) -> None:
        """The pending rows were not stored: forget them."""
        ...

    def empty(self) -> R:
        """No rows (an event set aside whose offset goes with the next flush)."""
        ...

    def rows_of(self, envs: Sequence[EventEnvelope]) -> R:
        """The rows of ``envs`` alone (a half of a batch, committed on its own)."""
        ...

    def rest(self, rows: R) -> R:
        """What of a batch's ``rows`` is left to store once its events were committed or set
        aside half by half."""
        ...

    async def store(self, conn: Any, rows: R) -> None:
        """Store ``rows`` in the transaction on ``conn``."""
        ...

    async def store_fenced(self, conn: Any, rows: R) -> list[int]:
        """Store ``rows`` as the transaction's first statement, which checks first that the
        leases of ``fence(rows)`` are still ours and locks them until the transaction ends: the
        slices no longer ours (then nothing is stored)."""
        ...

    def fence(self, rows: R, env: EventEnvelope | None = None) -> dict[int, int]:
        """The leases (slice -> epoch) a transaction storing ``rows`` (for ``env``) must hold."""
        ...

    def proof(self, rows: R) -> Proof:
        """Did a transaction that stored ``rows`` commit?"""
        ...

    def at_stop(self) -> dict[int, datetime]:
        """The heartbeats worth storing when the unit is handed over or stopped."""
        ...


@dataclass(eq=False)
class SliceOffsetRows:
    """A slice range's offset rows (``list[OffsetRow]``), pending in its validator."""

    sql: ProjectionSql
    unit: Unit
    """The projection and the range's key (``lo-hi``), as the rows store them."""
    epochs: dict[int, int]
    """The range's leases: slice -> epoch, for each slice of the range in order."""
    validator: Validator
    delivered_upto: datetime | None = None
    """Horizon mode: every event of the range below it is delivered (the processor notes it after
    each batch; a transactional delivery has committed it then, and stores it at stop)."""
    _oldest: datetime | None = field(default=None, init=False)
    """The oldest stored offset among the range's slices when none was due a heartbeat: a stored
    offset only moves up, so none is due while ``ts - every`` is not past it."""

    @property
    def has_pending(self) -> bool:
        return bool(self.validator.pending)

    def pending(self, heartbeats: dict[int, datetime]) -> list[OffsetRow]:
        rows = [OffsetRow(s, pid, n, ts) for pid, (s, n, ts) in self.validator.pending.items()]
        rows += [OffsetRow(s, HEARTBEAT_PID, 0, ts) for s, ts in heartbeats.items()]
        return rows

    def newest_pending(self) -> datetime | None:
        return max((ts for _, _, ts in self.validator.pending.values()), default=None)

    def committed(self, heartbeats: dict[int, datetime]) -> None:
        self.validator.commit(heartbeats)

    def rolled_back(self) -> None:
        self.validator.rollback()

    def empty(self) -> list[OffsetRow]:
        return []

    def rows_of(self, envs: Sequence[EventEnvelope]) -> list[OffsetRow]:
        latest: dict[str, EventEnvelope] = {}
        for e in envs:
            latest[e.persistence_id] = e
        return [OffsetRow(e.slice, pid, e.seq_nr, e.db_timestamp) for pid, e in latest.items()]

    def rest(self, rows: list[OffsetRow]) -> list[OffsetRow]:
        return [r for r in rows if r.persistence_id == HEARTBEAT_PID]  # the heartbeat rows

    async def store(self, conn: Any, rows: list[OffsetRow]) -> None:
        await self.sql.save_offsets(conn, self.unit.name, self.unit.key, rows)

    async def store_fenced(self, conn: Any, rows: list[OffsetRow]) -> list[int]:
        fence = LeaseFence(self.unit.owner, self.fence(rows))
        return await self.sql.save_offsets(conn, self.unit.name, self.unit.key, rows, fence=fence)

    def fence(self, rows: list[OffsetRow], env: EventEnvelope | None = None) -> dict[int, int]:
        touched = {r.slice: self.epochs[r.slice] for r in rows}
        if not touched and env is not None:
            touched[env.slice] = self.epochs[env.slice]
        return touched

    def proof(self, rows: list[OffsetRow]) -> Proof:
        row = next((r for r in rows if r.persistence_id != HEARTBEAT_PID), None)

        async def committed(conn: Any) -> bool:
            return row is not None and await self.sql.offset_row_exists(conn, self.unit.name, row)

        return committed

    def heartbeats(self, ts: datetime, every: timedelta) -> dict[int, datetime]:
        """Heartbeats at ``ts`` for the slices whose stored offset is older than ``ts - every``
        (asked after every batch: the range's slices are looked at only when one may be due)."""
        below = ts - every
        if self._oldest is not None and below <= self._oldest:
            return {}
        out: dict[int, datetime] = {}
        oldest: datetime | None = None
        for s in self.epochs:
            st = self.validator.slices.get(s)
            latest = None if st is None else st.latest
            if latest is None or latest < below:
                out[s] = ts
            elif oldest is None or latest < oldest:
                oldest = latest
        if not out:
            self._oldest = oldest
        return out

    def at_stop(self) -> dict[int, datetime]:
        """Horizon mode, when the range is handed over or stopped: the position delivered and
        committed so far for every slice of the range (heartbeat rows, without waiting
        ``heartbeat_offset_interval``). The next owner of any of these slices then resumes
        there, not at the oldest offset among them, which made it re-read (and skip as
        duplicates) most of what was processed since."""
        upto = self.delivered_upto
        if upto is None or self.validator.pending:
            return {}
        return self.heartbeats(upto, timedelta(0))


class TagOffsetRows:
    """A tag's offset rows (``{pid: (seq_nr, TimeUUID)}``), fenced by the tag's one lease."""

    def __init__(self, sql: TagOffsetSql, leases: LeaseSql, unit: Unit, tag: str, epoch: int) -> None:
        self.sql, self.leases, self.unit, self.tag = sql, leases, unit, tag
        self.name = unit.name
        self.lease = {0: epoch}
        """The tag's one lease (slice 0 of the projection's lease rows) at its epoch."""
        self.seq_nrs: dict[str, int] = {}
        """pid -> the latest seq_nr whose offset is stored."""
        self.accepted: TagRows = {}
        """pid -> (seq_nr, offset) accepted since the last commit."""

    def fresh(self, env: EventEnvelope) -> bool:
        """Not delivered before: dedup per pid by seq_nr (pending first, then stored)."""
        pid = env.persistence_id
        known = self.accepted[pid][0] if pid in self.accepted else self.seq_nrs.get(pid)
        return known is None or env.seq_nr > known

    def accept(self, env: EventEnvelope) -> None:
        assert isinstance(env.offset, TimeUUIDOffset)
        self.accepted[env.persistence_id] = (env.seq_nr, env.offset.value)

    @property
    def has_pending(self) -> bool:
        return bool(self.accepted)

    def pending(self, heartbeats: dict[int, datetime]) -> TagRows:
        return dict(self.accepted)  # a tag has no heartbeat rows

    def newest_pending(self) -> datetime | None:
        return None

    def committed(self, heartbeats: dict[int, datetime]) -> None:
        for pid, (seq_nr, _) in self.accepted.items():
            self.seq_nrs[pid] = seq_nr
        self.accepted = {}

    def rolled_back(self) -> None:
        self.accepted = {}

    def empty(self) -> TagRows:
        return {}

    def rows_of(self, envs: Sequence[EventEnvelope]) -> TagRows:
        rows: TagRows = {}
        for e in envs:
            assert isinstance(e.offset, TimeUUIDOffset)
            rows[e.persistence_id] = (e.seq_nr, e.offset.value)
        return rows

    def rest(self, rows: TagRows) -> TagRows:
        return {}

    async def store(self, conn: Any, rows: TagRows) -> None:
        await self.sql.save(conn, self.name, self.tag, rows)

    async def store_fenced(self, conn: Any, rows: TagRows) -> list[int]:
        lost = await self.leases.fence(conn, self.name, self.unit.owner, self.lease)
        if not lost:
            await self.sql.save(conn, self.name, self.tag, rows)
        return lost

    def fence(self, rows: TagRows, env: EventEnvelope | None = None) -> dict[int, int]:
        return dict(self.lease)

    def proof(self, rows: TagRows) -> Proof:
        row = next(iter(rows.items()), None)

        async def committed(conn: Any) -> bool:
            if row is None:
                return False
            stored = await self.sql.stored_seq_nr(conn, self.name, self.tag, row[0])
            return stored is not None and stored >= row[1][0]

        return committed

    def at_stop(self) -> dict[int, datetime]:
        return {}
