"""What a move that died leaves in the way of its range's writes, undone or finished by the
processes that wait for the range.

A move holds the range's mover lock on its source for as long as it runs
(:meth:`~journal.postgres.PostgresPartitions.hold_mover`); the lock goes with the mover's
session (kill -9, a crash, a lost host after the TCP keepalives). A write that waits for a
range looks, every :data:`LOOK_EVERY` seconds, whether a live move still holds it; if not:

- a range ``fenced`` at its source goes back to ``moving`` there: writable again at once, its
  copy so far kept (the source's move record says ``fence lapsed``; running the move again fences
  it anew, and its last pass copies what was written meanwhile);
- a range ``moving`` at its source (the move died while copying; only deletes wait for it) is
  given up: ``owned`` there again, the record gone; the target's copies stay unserved
  (``incoming``) and the next move of the range removes them before it copies;
- a range its source marked ``moved`` (the commit point: every row was copied) that its target
  does not serve yet is switched to the target, from a floor above the source's clock, as the
  move would have (the record says ``switch finished``; running the move again removes the
  source's rows).

Either change is made in a transaction holding the mover lock, so no move of the range starts
meanwhile, and a live move that lost its lock's session finds the range in a state its next step
refuses (it never writes ``moved`` over a fence that lapsed). docs/scaling-out.md has each crash
point.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime

from ..errors import JournalError, JournalUnavailable
from ..postgres import FENCED, INCOMING, MOVED, MOVING, OWNED, PartitionRow, redact
from .databases import Databases
from .layout import NOWHERE

log = logging.getLogger("journal.partitioned")

LOOK_EVERY = 0.5
"""Seconds between looks for a dead move while a write waits for its range."""


_LAPSED = (
    "the move fencing them on %s is gone; the fence lapsed (writes go on there; "
    "run `journal partitions move` again to finish the move)"
)
_ABANDONED = (
    "the move copying them from %s is gone; it is given up (the range is owned there "
    "again, its deletes go on; run `journal partitions move` again to move it)"
)


class DeadMoves:
    """Undoes a dead move's fence, or finishes its switch, for the slices a write waits for."""

    def __init__(self, dbs: Databases) -> None:
        self.dbs = dbs
        self._lock = asyncio.Lock()

    async def clear(self, slices: Sequence[int]) -> bool:
        """For each of ``slices`` that waits for a move that is gone, the range made writable
        again (where it was, or where it went); True if the map changed (reload it)."""
        async with self._lock:
            m = self.dbs.map
            changed = False
            seen: set[tuple[int, int]] = set()
            for s in sorted(set(slices)):
                try:
                    if m.fenced[s]:
                        changed |= await self._undo(m.owners[s], s, seen, fenced=True)
                    elif m.owners[s] == NOWHERE:
                        changed |= await self._switch(s, seen)
                    else:  # a delete waits for a range being copied
                        changed |= await self._undo(m.owners[s], s, seen, fenced=False)
                except JournalUnavailable as e:  # that database is down: its slices wait on
                    log.debug("looking for a dead move of slice %s: %s", s, e)
                except JournalError as e:  # a state no move leaves (changed by hand?): said, left alone
                    log.warning("slice %s waits for a move in a state this journal does not finish: %s", s, e)
            return changed

    async def _undo(self, source: int, slice_: int, seen: set[tuple[int, int]], *, fenced: bool) -> bool:
        """The dead move's fence lapsed on its source (``fenced``), else its copy given up there."""
        row = _covering(self.dbs.rows_of(source), slice_, FENCED if fenced else MOVING)
        if row is None or (source, row.min_slice) in seen:
            return False
        seen.add((source, row.min_slice))
        partitions = (await self.dbs.usable(source)).partitions()
        if not await (partitions.lapse_fence if fenced else partitions.abandon_move)(row.min_slice):
            return False
        said = _LAPSED if fenced else _ABANDONED
        log.warning("slices %s-%s: " + said, row.min_slice, row.max_slice, self.dbs.names[source])
        return True

    async def _switch(self, slice_: int, seen: set[tuple[int, int]]) -> bool:
        found = [
            (r.epoch, i, r)
            for i in range(len(self.dbs.backends))
            if (r := _covering(self.dbs.rows_of(i), slice_, MOVED)) is not None and r.location
        ]
        if not found:
            return False
        _, source, row = max(found, key=lambda f: (f[0], f[1]))
        if (source, row.min_slice) in seen or row.location is None:
            return False
        seen.add((source, row.min_slice))
        target = await self.dbs.usable(self.dbs.index_of(row.location))

        async def complete(moved: PartitionRow, floor: datetime) -> None:
            await target.partitions().set_range(
                moved.min_slice, moved.max_slice, OWNED, moved.epoch, None, floor,
                expect=(INCOMING, OWNED), keep=(OWNED,),
            )  # fmt: skip

        b = await self.dbs.usable(source)
        if not await b.partitions().finish_switch(row.min_slice, complete):
            return False
        log.warning(
            "slices %s-%s: the move that switched them from %s is gone; its switch is finished (%s serves "
            "them; run `journal partitions move` again to remove their rows from the source)",
            row.min_slice, row.max_slice, self.dbs.names[source], redact(row.location),
        )  # fmt: skip
        return True


def _covering(rows: Sequence[PartitionRow], slice_: int, state: str) -> PartitionRow | None:
    return next((r for r in rows if r.min_slice <= slice_ <= r.max_slice and r.state == state), None)
