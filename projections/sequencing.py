"""Sequenced dead letters (``retry-and-dead-letter-sequenced``, issue 36 item 4), the worker's
side: once an event of a persistence id is dead-lettered, every later event of that id is parked
behind it (``projection_parked_event``), in the transaction that stores the offset rows moving
past it, while the other ids go on. The drain (:mod:`.dead_letters`) applies them in order when
the dead letter is retried or discarded; then the id flows again.

A processor keeps the ids it knows to be held (loaded at its start, added when it dead-letters
an event). Only for those does a transaction ask the database, under the pid's advisory lock
(:meth:`ParkedSql.lock`), whether the id is still held: parked when it is, handled when a drain
has emptied it. Nothing else ever holds an id again but this processor's own dead letter, so an
id found free stays free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from journal.envelope import EventEnvelope

from .offset_rows import OffsetRows
from .parked_store import ParkedSql
from .stats import Stats
from .transactions import TransactionRunner


class Sequencer:
    """The held persistence ids of one processor, and the parking of their events."""

    def __init__(self, sql: ParkedSql, tx: TransactionRunner, stats: Stats) -> None:
        self.sql = sql
        self.tx = tx
        self.stats = stats
        self.held: set[str] | None = None
        """The ids known to be held (None until loaded, at the first batch)."""
        self._parked = 0
        """Events parked by the transaction being run (counted once it commits)."""

    async def ready(self) -> set[str]:
        """The held ids, read from the database at the first batch (retried through outages)."""
        if self.held is None:

            async def load() -> set[str]:
                async with self.tx.pool.acquire() as conn:
                    return await self.sql.held_pids(conn, self.tx.unit.name)

            self.held = await self.tx.read("loading held persistence ids", load)
        return self.held

    def hold(self, pid: str) -> None:
        """``pid``'s event was just dead-lettered: its later events are parked."""
        if self.held is not None:
            self.held.add(pid)

    async def split(self, conn: Any, envs: Sequence[EventEnvelope]) -> Sequence[EventEnvelope]:
        """Inside the offset transaction on ``conn``: park the events of ``envs`` whose id is held
        and return the others, for the handler. Ids found free are forgotten."""
        self._parked = 0
        held = self.held
        if not held:
            return envs
        name = self.tx.unit.name
        still: set[str] = set()
        for pid in sorted({e.persistence_id for e in envs if e.persistence_id in held}):
            await self.sql.lock(conn, name, pid)
            if await self.sql.held(conn, name, pid):
                still.add(pid)
            else:
                held.discard(pid)
        if not still:
            return envs
        parked = [e for e in envs if e.persistence_id in still]
        await self.sql.park(conn, name, self.tx.unit.key, parked)
        self._parked = len(parked)
        return [e for e in envs if e.persistence_id not in still]

    def committed(self) -> int:
        """The transaction that ran :meth:`split` committed: how many it parked (counted)."""
        n, self._parked = self._parked, 0
        self.stats.parked += n
        return n

    async def park_alone(self, env: EventEnvelope, offsets: OffsetRows[Any], tries: int) -> bool:
        """At-least-once: park ``env`` in a transaction of its own when its id is still held
        (True; its offset goes with the next flush), else forget the id (False: handle it)."""
        parked = False

        async def body(conn: Any) -> None:
            nonlocal parked
            parked = not await self.split(conn, [env])

        await self.tx.run(body, tries=tries, fence=offsets.fence(offsets.empty(), env))
        self.committed()
        return parked
