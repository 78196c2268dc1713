"""Routing one operation to the database that serves its slice, and going on when the map changes.

Every database checks, for every write and slice read, that it serves the slices at the map
epoch the caller sends (``journal.postgres.timestamp_rule``); a refusal
(:class:`~journal.errors.SliceRangeMoved`) makes the router reload the map and try again where
the slice is now, waiting while a move switches the range, up to ``partitions.fence_wait``.
While it waits, it looks every so often whether the move is still alive; a dead move's fence is
undone, or its switch finished (:mod:`.dead_moves`), so a crashed move never blocks the range.
Operations that the database does not check in their own statement (reads by persistence id,
snapshots) are checked right after they ran (``check``): a result read from a database that no
longer served the slice when it answered is thrown away and read again where it is now.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from ..errors import JournalUnavailable, SliceRangeMoved
from ..postgres import PostgresBackend
from .databases import Databases
from .dead_moves import LOOK_EVERY, DeadMoves
from .layout import NOWHERE

T = TypeVar("T")

POLL = 0.01
"""Seconds between looks at the map while a slice waits for a move's switch."""


class Router:
    """Where a slice is served, and the retry loop around an operation on it."""

    def __init__(self, dbs: Databases) -> None:
        self.dbs = dbs
        self.fence_wait = dbs.settings.partitions.fence_wait
        self.dead_moves = DeadMoves(dbs)
        self._looked = 0.0

    def deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.fence_wait

    async def settle(
        self, deadline: float, what: str, generation: int, waiting: bool, slices: Sequence[int] = ()
    ) -> None:
        """After a refusal (or a slice served nowhere): reload the map (once for all callers
        refused at this generation); wait a little if the range is being switched, and every
        :data:`~.dead_moves.LOOK_EVERY` seconds look whether the move that holds ``slices``
        is gone (then its fence is undone or its switch finished)."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if waiting and slices and now - self._looked >= LOOK_EVERY and deadline - now < self.fence_wait - LOOK_EVERY:
            self._looked = now
            if await self.dead_moves.clear(slices):
                generation = self.dbs.generation  # reload now
        if loop.time() > deadline:
            raise JournalUnavailable(
                f"{what}: the slices' database did not settle within partitions.fence_wait "
                f"({self.fence_wait}s): a move of their range is under way, or was interrupted "
                "(`journal partitions show` says which)"
            )
        if waiting:
            await asyncio.sleep(POLL)
        try:
            await self.dbs.reload(generation)
        except JournalUnavailable:
            await asyncio.sleep(POLL)

    async def on_owner(
        self, slice_: int, what: str, op: Callable[[PostgresBackend], Awaitable[T]], *, check: str | None = None,
        writing: bool = False,
    ) -> T:  # fmt: skip
        """``op`` on the database serving ``slice_``; with ``check`` (read, write or delete),
        followed by the owner check on that database: a refused result is done again where
        the slice is served now (``op`` must be idempotent)."""
        deadline: float | None = None
        while True:
            m, generation = self.dbs.map, self.dbs.generation
            i = m.owner(slice_)
            if i == NOWHERE or (writing and m.fenced[slice_]):
                deadline = deadline or self.deadline()
                await self.settle(deadline, what, generation, waiting=True, slices=[slice_])
                continue
            backend = await self.dbs.usable(i)
            try:
                out = await op(backend)
                if check is not None:
                    await backend.partitions().check(m.epoch, [slice_], check)
                return out
            except SliceRangeMoved as e:
                deadline = deadline or self.deadline()
                await self.settle(deadline, what, generation, waiting=e.waiting, slices=[slice_])
            except JournalUnavailable as e:
                self.dbs.failed(i, e)
                raise
