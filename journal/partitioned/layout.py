"""The partition map as a routing table: which database serves each of the 1024 slices.

Built from what every database says of itself (its ``slice_partition`` rows) over the layout
of ``partitions.databases``: with N databases, database i holds ``[i*1024/N, (i+1)*1024/N - 1]``
(as Akka Persistence R2DBC splits its data partitions). A database whose map has no row was never
partitioned and serves its range of that layout. Where databases disagree (a move's switch
in progress), the row with the highest epoch wins; a slice nobody serves right now (between a
move's two switch steps) routes nowhere, and its operations wait. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from ..ids import NUMBER_OF_SLICES, slice_ranges
from ..postgres import FENCED, SERVING, PartitionRow

NOWHERE = -1
"""The owner of a slice that no database serves right now."""


@dataclass(frozen=True, slots=True)
class Piece:
    """A contiguous run of slices served by one database."""

    database: int
    min_slice: int
    max_slice: int


class PartitionMap:
    """The owner of every slice (an index into the journal's list of databases) and the map epoch."""

    def __init__(
        self, owners: Sequence[int], epoch: int, fenced: Sequence[bool], floors: Mapping[int, datetime]
    ) -> None:
        self.owners = list(owners)
        self.epoch = epoch
        self.fenced = list(fenced)
        self.floors = dict(floors)
        """Per database: the newest floor of a range it serves (what a new event of it is stamped at least)."""

    @staticmethod
    def seed(databases: int) -> list[tuple[int, int]]:
        """The layout of ``partitions.databases``: database i's range."""
        return slice_ranges(databases)

    @classmethod
    def build(cls, seeded: int, rows: Mapping[int, Sequence[PartitionRow]]) -> PartitionMap:
        """The map from each database's rows (``rows[i]``; databases ``0..seeded-1`` are the
        configured ones, in order; later ones were found through the rows' locations)."""
        best = [(-2, NOWHERE, False)] * NUMBER_OF_SLICES
        epoch = 0
        floors: dict[int, datetime] = {}
        seeds = cls.seed(seeded) if seeded else []
        for db, its in rows.items():
            if not its and db < seeded:  # never partitioned: its range of the layout
                lo, hi = seeds[db]
                for s in range(lo, hi + 1):
                    if best[s][0] < -1:
                        best[s] = (-1, db, False)
            for r in its:
                epoch = max(epoch, r.epoch)
                if r.state not in SERVING:
                    continue
                if r.floor is not None and (db not in floors or r.floor > floors[db]):
                    floors[db] = r.floor
                for s in range(r.min_slice, r.max_slice + 1):
                    if r.epoch > best[s][0]:
                        best[s] = (r.epoch, db, r.state == FENCED)
        return cls([b[1] for b in best], epoch, [b[2] for b in best], floors)

    def owner(self, slice_: int) -> int:
        return self.owners[slice_]

    def pieces(self, min_slice: int, max_slice: int) -> list[Piece]:
        """The range split into runs of one owner each, in slice order."""
        out: list[Piece] = []
        start = min_slice
        for s in range(min_slice + 1, max_slice + 2):
            if s > max_slice or self.owners[s] != self.owners[start]:
                out.append(Piece(self.owners[start], start, s - 1))
                start = s
        return out

    def databases_of(self, min_slice: int, max_slice: int) -> list[int]:
        """The databases serving some slice of the range, in order of first slice."""
        seen: list[int] = []
        for p in self.pieces(min_slice, max_slice):
            if p.database not in seen:
                seen.append(p.database)
        return seen

    def served(self) -> list[int]:
        """Every database that serves a slice."""
        return sorted({o for o in self.owners if o != NOWHERE})

    def describe(self, names: Sequence[str]) -> list[tuple[int, int, str]]:
        """``(min_slice, max_slice, database name)`` runs (``journal partitions show``)."""
        return [
            (p.min_slice, p.max_slice, names[p.database] if p.database != NOWHERE else "(being switched)")
            for p in self.pieces(0, NUMBER_OF_SLICES - 1)
        ]
