"""Moving a slice range to another database while the journal runs (``journal partitions move``).

The steps, and what each guarantees (docs/scaling-out.md has the picture):

1. **Start.** The target records the range as ``incoming`` (it serves none of it yet), the
   source records the move (``slice_move``) and marks the range ``moving`` at the new epoch, then
   waits out the transactions that were deleting in it. From here deletes of the range wait
   (a delete could otherwise remove a row the copy already took); writes and reads go on.
2. **Catch-up copy.** Passes over the source's rows of the range stamped in ``[copied_to,
   horizon)``, each written to the target as it is (same db_timestamp; a row already there is
   left alone, so a pass may overlap an earlier one); ``copied_to`` is saved after each pass.
   Every row below the source's horizon is committed, so nothing stamped below ``copied_to``
   can appear later. Passes end when one copies little.
3. **Fence.** The move's own session (the one holding the range's mover lock on the source from
   the first step to the last) takes the range's fence lock and marks it ``fenced``; writes of
   the range are refused (the journal waits and retries each on its own) unless that session is
   gone (the fence lapses with a crashed move). The writers already past the check are waited
   out; the last pass copies every remaining row, then the range's snapshots are copied whole.
4. **Switch.** The source marks the range ``moved`` to the target, on the move's own session:
   the commit point (from then on the source refuses every write and slice read of it). Then
   the source's clock is read and the target marks the range ``owned`` with that reading as its
   floor: no new event of the range is stamped below anything a reader of the source could have
   passed, whatever the skew between the two servers' clocks. Between these two steps the range is served nowhere and
   its operations wait (a few milliseconds).
5. **Removal.** The source deletes the range's rows; the move record goes. The ``moved`` row
   stays: a process with an old map is refused there and told where the range went.

A move that dies never blocks its range: while nobody holds the mover lock, a journal process
waiting for the range undoes the fence or finishes the switch (:mod:`.dead_moves`). Interrupted
at any step (the tool killed, a database crashed), running the same move again finishes it from
the state the databases recorded: before the switch it redoes the fence from
``copied_to``, after it it completes the target's row and the removal. Nothing is lost (the
copy never skips a committed row) or doubled (the copy keeps keys, and the range is served by one
database at a time).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

import asyncpg

from ..errors import ConfigurationError, InvalidArgument, JournalUnavailable
from ..ids import validate_slice_range
from ..postgres import (
    FENCED,
    INCOMING,
    MOVED,
    MOVING,
    OWNED,
    MoveRecord,
    PostgresBackend,
    connect,
    redact,
    target_of,
    without_password,
)
from ..query.horizon import HorizonTracker
from .backend import PartitionedBackend
from .layout import NOWHERE

log = logging.getLogger("journal.partitioned.move")

COPY_PAGE = 5000
"""Event rows per copy round trip."""
SMALL_PASS = 2000
"""A catch-up pass that copied fewer rows than this is the last before the fence."""
DRAIN_TIMEOUT = 60.0
"""Seconds the move waits for the transactions in progress to end."""
MOVER_PATIENCE = 5.0
"""Seconds a move waits for the range's mover lock (a journal finishing or undoing what a dead
move left holds it for a moment) before it says another move of the range is running."""
_START = datetime(1, 1, 1, tzinfo=UTC)

K = TypeVar("K")
T = TypeVar("T")


async def _pages(
    read: Callable[[K], Awaitable[list[T]]], first: K, key: Callable[[T], K], size: int
) -> AsyncIterator[list[T]]:
    """Every page of a keyset-paged read: ``read(after)`` from ``first``, each next page after
    the ``key`` of the last row, until a page comes short."""
    after = first
    while True:
        rows = await read(after)
        if rows:
            yield rows
        if len(rows) < size:
            return
        after = key(rows[-1])


@dataclass
class MoveReport:
    """What a move did (``journal partitions move`` prints it; the benchmark measures it)."""

    min_slice: int
    max_slice: int
    source: str
    target: str
    epoch: int
    resumed_from: str | None = None
    rows: int = 0
    states: int = 0
    """Durable state rows copied (a state copied again at a later revision counts again)."""
    passes: int = 0
    copy_seconds: float = 0.0
    fence_seconds: float = 0.0
    """From the fence to the switch: how long writes of the range waited at most."""
    removed_pids: int = 0
    steps: list[str] = field(default_factory=list)


class SliceMove:
    """One move of ``[min_slice, max_slice]`` to the database ``target`` (a DSN)."""

    def __init__(
        self, journal: PartitionedBackend, min_slice: int, max_slice: int, target: str,
        say: Callable[[str], None] | None = None,
    ) -> None:  # fmt: skip
        validate_slice_range(min_slice, max_slice)
        self.journal = journal
        self.dbs = journal.dbs
        self.lo, self.hi = min_slice, max_slice
        self.target_dsn = target
        self.say = say or (lambda line: log.info("%s", line))
        self._tracker = HorizonTracker()
        self._state_tracker = HorizonTracker()

    # -- where things are ---------------------------------------------------------------------

    async def _find(self) -> tuple[int, int, MoveRecord | None]:
        """The source (the database with a record of this move, else the one serving the range)
        and the target's index."""
        t = self.dbs.index_of(self.target_dsn)  # first: the map's row of the target needs its password
        await self.dbs.reload()
        for i in range(len(self.dbs.backends)):
            if i == t:
                continue
            try:
                b = await self.dbs.usable(i)
            except JournalUnavailable:
                continue
            for rec in await b.partitions().moves():
                if (rec.min_slice, rec.max_slice) == (self.lo, self.hi):
                    if rec.target != without_password(self.target_dsn):
                        raise ConfigurationError(
                            f"slices {self.lo}-{self.hi} are being moved to {rec.target}, not to "
                            f"{redact(self.target_dsn)}: finish that move first"
                        )
                    return i, t, rec
                if rec.min_slice <= self.hi and rec.max_slice >= self.lo:
                    raise ConfigurationError(
                        f"slices {rec.min_slice}-{rec.max_slice} are being moved: finish that move first"
                    )
        owners = self.dbs.map.databases_of(self.lo, self.hi)
        if len(owners) != 1 or owners[0] < 0:
            raise InvalidArgument(
                f"slices {self.lo}-{self.hi} are not served by one database ({self.dbs.map.describe(self.dbs.names)})"
            )
        if owners[0] == t:
            raise InvalidArgument(f"slices {self.lo}-{self.hi} are already served by {redact(self.target_dsn)}")
        return owners[0], t, None

    async def _reach_target(self) -> None:
        """Connect to the target once before anything else, saying what the move waits for: a
        silent server fails as unavailable within the retry budget (the migrations' own
        connection has no timeout), a missing database or a wrong password is bad input."""
        settings = self.journal.settings
        target = self.dbs.passwords.fill(self.target_dsn)
        self.say(f"target {target_of(target)}: connecting (connect timeout {settings.connection.connect_timeout:g} s)")
        await (await connect(target, settings, what="connect")).close()

    async def plan(self) -> list[str]:
        """What the move would do (``--dry-run``), with nothing changed."""
        await self._reach_target()
        s, t, rec = await self._find()
        src = await self.dbs.usable(s)
        lines = [
            f"move slices {self.lo}-{self.hi} from {self.dbs.names[s]} to {self.dbs.names[t]}",
            f"map epoch {self.dbs.map.epoch} -> {rec.epoch if rec else self.dbs.map.epoch + 1}",
        ]
        if rec is not None:
            lines.append(f"resume an interrupted move at step {rec.step!r} (copied up to {rec.copied_to})")
        rows = {r.min_slice: r for r in await src.partitions().rows()}
        state = rows[self.lo].state if self.lo in rows else OWNED
        lines.append(
            f"the source has the range {state}; its events of the range: "
            f"{'some' if await src.partitions().events_inside(self.lo, self.hi) else 'none'}"
        )
        lines += [
            "steps: migrate the target; mark the range incoming there and moving here (deletes wait);",
            "       copy its rows in passes while writes go on; fence (writes wait), copy the rest and",
            "       the snapshots; switch the map (writes resume on the target); remove the rows here",
        ]
        return lines

    # -- the move -----------------------------------------------------------------------------

    async def run(self) -> MoveReport:
        from ..postgres import schema_migrations

        upgrade = schema_migrations().upgrade

        await self._reach_target()
        await asyncio.to_thread(upgrade, self.dbs.passwords.fill(self.target_dsn), self.journal.settings.schema)
        s, _, _ = await self._find()
        mover = await (await self.dbs.usable(s)).partitions().hold_mover(self.lo, self.hi, MOVER_PATIENCE)
        try:
            return await self._run(mover)
        finally:
            await mover.close()

    async def _run(self, mover: asyncpg.Connection) -> MoveReport:
        """The move, while ``mover`` holds the range's mover lock on the source."""
        s, t, rec = await self._find()
        src, dst = await self.dbs.usable(s), await self.dbs.usable(t)
        if await src.partitions().has_replication():
            raise ConfigurationError(
                "the source database holds replicated logs' state (a replicating location's home "
                "database, or one recovering): its ranges stay (see docs/scaling-out.md)"
            )
        epoch = rec.epoch if rec is not None else self.dbs.map.epoch + 1
        report = MoveReport(self.lo, self.hi, self.dbs.names[s], self.dbs.names[t], epoch, rec.step if rec else None)
        target_loc = without_password(self.target_dsn)
        source_loc = without_password(self.dbs.dsns[s])
        rows = {r.min_slice: r for r in await src.partitions().rows()}
        here = rows.get(self.lo)
        if here is not None and here.state == MOVED:  # switched already: finish it
            await self._switch_target(src, dst, epoch, report)
            await self._remove(src, report)
            return report
        await self._start(src, dst, epoch, source_loc, target_loc, rec, report)
        copied_to = rec.copied_to if rec is not None and rec.copied_to else _START
        copied_to = await self._catch_up(src, dst, copied_to, report)
        await self._copy_pid_tables(src, dst, report)
        await src.partitions().fence(mover, self.lo, True)
        try:
            fenced_at = time.perf_counter()
            await src.partitions().set_range(self.lo, self.hi, FENCED, epoch, target_loc, expect=(MOVING, FENCED))
            await src.partitions().save_move(self.lo, "fenced", copied_to)
            report.steps.append("fenced")
            await src.partitions().drain(DRAIN_TIMEOUT)
            report.rows += await self._copy_window(src, dst, copied_to, None)
            report.states += await self._copy_states(src, dst, copied_to, None)
            await dst.partitions().write_rows(
                "snapshot",
                await src.partitions().rows_by_slices("snapshot", self.lo, self.hi),
                replace_slices=(self.lo, self.hi),
            )
            await dst.partitions().write_rows(
                "snapshot_older",
                await src.partitions().rows_by_slices("snapshot_older", self.lo, self.hi),
                replace_slices=(self.lo, self.hi),
            )
            # the commit point, on the session that has held the fence since before the drain: had
            # it been lost (and with it the fence), this fails, and nothing written meanwhile is left out
            await src.partitions().set_range(self.lo, self.hi, MOVED, epoch, target_loc, expect=(FENCED,), on=mover)
            report.steps.append("switched")
        finally:
            await src.partitions().fence(mover, self.lo, False)
        await self._switch_target(src, dst, epoch, report)
        report.fence_seconds = time.perf_counter() - fenced_at
        await self._remove(src, report)
        return report

    async def _start(
        self, src: PostgresBackend, dst: PostgresBackend, epoch: int, source_loc: str, target_loc: str,
        rec: MoveRecord | None, report: MoveReport,
    ) -> None:  # fmt: skip
        if not await dst.partitions().rows() and await dst.partitions().events_inside(0, 1023):
            raise ConfigurationError(
                f"the target {redact(self.target_dsn)} holds events but no partition map: it is another "
                "journal's database"
            )
        before = {r.min_slice: r.state for r in await dst.partitions().rows()}.get(self.lo)
        await dst.partitions().set_range(self.lo, self.hi, INCOMING, epoch, source_loc, expect=(None, INCOMING))
        if rec is None:
            if before == INCOMING:  # a given-up move's copies (never served): copied afresh
                await dst.partitions().remove_range(self.lo, self.hi)
            await src.partitions().start_move(self.lo, self.hi, target_loc, epoch, "moving")
        await src.partitions().set_range(self.lo, self.hi, MOVING, epoch, target_loc, expect=(OWNED, MOVING, FENCED))
        await self.dbs.reload()
        await src.partitions().drain(DRAIN_TIMEOUT)  # deletes that passed the check before "moving"
        report.steps.append("moving")

    async def _bound(self, src: PostgresBackend) -> datetime:
        """Below it every row of the source's event_journal and durable_state is committed: the
        least of the two tables' horizons."""
        events = self._tracker.observe(await src.slices.horizon_reading())
        states = self._state_tracker.observe(await src.durable_state_store().changes().horizon_reading())
        return min(events, states)

    async def _catch_up(
        self, src: PostgresBackend, dst: PostgresBackend, copied_to: datetime, report: MoveReport
    ) -> datetime:
        started = time.perf_counter()
        while True:
            bound = await self._bound(src)
            n = await self._copy_window(src, dst, copied_to, bound)
            states = await self._copy_states(src, dst, copied_to, bound)
            copied_to = bound
            await src.partitions().save_move(self.lo, "moving", copied_to)
            report.rows += n
            report.states += states
            report.passes += 1
            if n + states < SMALL_PASS:
                break
        report.copy_seconds = time.perf_counter() - started
        return copied_to

    async def _copy_window(
        self, src: PostgresBackend, dst: PostgresBackend, since: datetime, until: datetime | None
    ) -> int:
        """Every row of the range stamped in ``[since, until)`` (``until`` None: no end), with
        the tag rows of their pids; returns the number of event rows."""
        n = 0
        parts = src.partitions()
        async for rows in _pages(
            lambda after: parts.event_rows(self.lo, self.hi, since, until, after, COPY_PAGE),
            ("", 0),
            lambda last: (last["persistence_id"], last["seq_nr"]),
            COPY_PAGE,
        ):
            await dst.partitions().write_rows("event_journal", rows)
            tags = sorted({t for r in rows for t in (r["tags"] or ())})
            if tags:
                pids = sorted({r["persistence_id"] for r in rows if r["tags"]})
                await dst.partitions().write_rows("tag_views", await parts.tag_rows(tags, pids))
            n += len(rows)
        return n

    async def _copy_states(
        self, src: PostgresBackend, dst: PostgresBackend, since: datetime, until: datetime | None
    ) -> int:
        """Every durable state of the range stamped in ``[since, until)``, as it is now. A state
        is one row updated in place: one updated after a pass read it is stamped above that
        pass's bound (the horizon's promise), so a later pass, or the last one at the fence,
        copies it again over its earlier copy (:attr:`~journal.postgres.partition_statements.
        PartitionStatements.newer_state`)."""
        n = 0
        parts = src.partitions()
        async for rows in _pages(
            lambda after: parts.state_rows(self.lo, self.hi, since, until, after, COPY_PAGE),
            "",
            lambda last: last["persistence_id"],
            COPY_PAGE,
        ):
            await dst.partitions().write_rows("durable_state", rows)
            n += len(rows)
        return n

    async def _copy_pid_tables(self, src: PostgresBackend, dst: PostgresBackend, report: MoveReport) -> None:
        """Tag write progress and scanning rows of the range's pids (they change only through
        deletes, which wait while the range is moving)."""
        parts = src.partitions()
        async for pids in _pages(lambda after: parts.pids_after(self.lo, self.hi, after, 1000), "", str, 1000):
            for table in ("tag_write_progress", "tag_scanning"):
                await dst.partitions().write_rows(table, await parts.rows_by_pids(table, pids), replace_pids=pids)

    async def _switch_target(self, src: PostgresBackend, dst: PostgresBackend, epoch: int, report: MoveReport) -> None:
        """After the commit point: the target serves the range from a floor above the source's
        clock (read after the switch committed)."""
        floor = await src.partitions().clock()
        await dst.partitions().set_range(
            self.lo, self.hi, OWNED, epoch, None, floor, expect=(INCOMING, OWNED), keep=(OWNED,)
        )
        await self.dbs.reload()
        report.steps.append("owned by the target")

    async def _remove(self, src: PostgresBackend, report: MoveReport) -> None:
        report.removed_pids = await src.partitions().remove_range(self.lo, self.hi)
        await src.partitions().end_move(self.lo)
        report.steps.append("removed from the source")


async def move_state(journal: PartitionedBackend, source: int, rec: MoveRecord) -> str:
    """A move recorded on database ``source``, in words: running, or where it was interrupted
    and what that means for the range's writes now (``journal partitions show``)."""
    dbs = journal.dbs
    src = await dbs.usable(source)
    head = f"move of {rec.min_slice}-{rec.max_slice} to {redact(rec.target)} (step {rec.step!r}"
    head += f", copied up to {rec.copied_to})" if rec.copied_to else ")"
    pid = await src.partitions().mover(rec.min_slice)
    if pid is not None:
        return f"{head}: running (its session is server process {pid} here)"
    rows = {r.min_slice: r for r in await src.partitions().rows()}
    here = rows.get(rec.min_slice)
    state = here.state if here is not None else None
    if state == MOVED:
        owner = dbs.map.owner(rec.min_slice)
        if owner != NOWHERE:
            return (
                f"{head}: interrupted after the switch (no move is running): {dbs.names[owner]} serves the range; "
                "its rows here are not removed yet: run the move again to remove them"
            )
        return (
            f"{head}: interrupted between the two switch steps (no move is running): the next write of the "
            "range finishes the switch to the target, or run the move again"
        )
    if state == FENCED or rec.step == "fence lapsed":
        return (
            f"{head}: interrupted at the fence (no move is running): the fence has lapsed, writes of the range "
            "go on here; run the move again to finish it"
        )
    return (
        f"{head}: interrupted during the copy (no move is running): writes of the range go on here; its next "
        "delete gives the move up (run the move again to move the range)"
    )
