"""Where each slice range of the journal is stored, for Spark: a JDBC source per range.

A journal on one database is one source for all 1024 slices. A journal over several databases
(``partitions.databases``, docs/scaling-out.md) serves each slice range from one of them; the
reader then gives each Spark partition one slice range on the database that holds it: the
ranges of ``slice_ranges(partitions)``, each cut where the partition map changes database.

The placement is read from the databases once, when the read is planned. A move of a range
(``journal partitions move``) that switches it while Spark reads is not seen by the read: run
Spark reads outside a move (``journal partitions show`` lists the moves under way).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from journal.errors import InvalidArgument, JournalUnavailable
from journal.ids import NUMBER_OF_SLICES, slice_ranges
from journal.journal import Journal

from .jdbc import JdbcSource, jdbc_source


@dataclass(frozen=True)
class SliceSource:
    """A contiguous slice range and the JDBC source of the database that holds it."""

    source: JdbcSource
    min_slice: int
    max_slice: int


async def placement(journal: Journal, *, local: bool = True) -> list[SliceSource]:
    """The journal's slice ranges with the JDBC source of each (one, for a journal on one
    database), in slice order, covering every slice once; the partition map is read afresh.

    Raises:
        JournalUnavailable: a range is being switched by a move right now (nobody serves it).
    """
    schema = journal.settings.schema
    sources: dict[str, JdbcSource] = {}
    out = []
    for home in await journal.backend.slice_homes(0, NUMBER_OF_SLICES - 1, fresh=True):
        if home.dsn is None:
            raise JournalUnavailable(
                f"slices {home.min_slice}-{home.max_slice} are being switched by a move: read again when it is done"
            )
        if home.dsn not in sources:
            sources[home.dsn] = jdbc_source(home.dsn, schema, local=local)
        out.append(SliceSource(sources[home.dsn], home.min_slice, home.max_slice))
    return out


def spark_ranges(placed: Sequence[SliceSource], partitions: int) -> list[SliceSource]:
    """One entry per Spark partition: each range of ``slice_ranges(partitions)`` cut where the
    database changes (so a range that two databases share is read as two partitions).

    Raises:
        InvalidArgument: ``placed`` does not cover every slice exactly once, in order.
    """
    if [s for p in placed for s in range(p.min_slice, p.max_slice + 1)] != list(range(NUMBER_OF_SLICES)):
        got = [(p.min_slice, p.max_slice) for p in placed]
        raise InvalidArgument(f"the slice sources must cover slices 0-1023 once, in order: got {got}")
    out = []
    for lo, hi in slice_ranges(partitions):
        for p in placed:
            a, b = max(lo, p.min_slice), min(hi, p.max_slice)
            if a <= b:
                out.append(SliceSource(p.source, a, b))
    return out
