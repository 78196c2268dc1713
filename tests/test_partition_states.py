"""Durable state on a partitioned journal: each state in the database serving its slice, and
``journal partitions move`` carrying a range's states with its events, online, on real servers.

The states are read back from each database directly: a pid's row is in the database of its slice
and nowhere else; changes by slices over several databases deliver the latest revision of every
pid; a move under upsert load loses no acknowledged revision, leaves none of the range behind, and
a live changes query following the range never sees a revision go back.
"""

from __future__ import annotations

import asyncio
import time
from asyncio.subprocess import PIPE
from typing import Any

import asyncpg
import pytest
from test_partition_dead_moves import (
    BACK_WITHIN,
    FENCE_WAIT,
    STEPS,
    _kill_mover_at,
    _waiting_on_lock,
    kill_mover_in_its_copy,
    move_tool,
)
from test_partitions import partitioned, settings, stored

from journal import (
    AdditionalColumn,
    ConfigurationError,
    DeletedState,
    DurableState,
    JournalUnavailable,
    StateWrite,
    StateWritten,
    UpdatedState,
    slice_for,
)
from journal.backends import open_partitioned
from journal.partitioned.move import SliceMove
from tests.support.waiting import wait_until

LO, HI = 512, 767


def pids_of(et: str, lo: int, hi: int, n: int) -> list[str]:
    return [p for p in (f"{et}|{i:x}{i * 7919:x}" for i in range(5000)) if lo <= slice_for(p) <= hi][:n]


async def state_rows(dsn: str) -> dict[str, int]:
    return {r[0]: r[1] for r in await stored(dsn, "SELECT persistence_id, revision FROM durable_state")}


async def test_states_live_in_the_database_of_their_slice(parts: list[str]) -> None:
    """Before: ``journal.durable_state()`` raised UnsupportedOperation on a partitioned journal."""
    dbs = parts[:2]  # 0-511 on the first, 512-1023 on the second
    low, high = pids_of("Acct", 0, 511, 10), pids_of("Acct", 512, 1023, 10)
    async with partitioned(dbs, eventual_consistency_delay=0.0) as j:
        store = j.durable_state()
        for p in low[:5] + high[:5]:
            assert (await store.upsert(p, 1, {"pid": p, "n": 1})).revision == 1
        # one call over both databases: one outcome per part, in order
        outcomes = await store.upsert_many(
            [StateWrite(p, 2, {"pid": p, "n": 2}) for p in low[:5] + high[:5]]
            + [StateWrite(p, 1, {"pid": p, "n": 1}) for p in low[5:] + high[5:]]
            + [StateWrite(low[0] + "x", 3, {"gap": True})]
        )
        assert [type(o).__name__ for o in outcomes] == ["StateWritten"] * 20 + ["RevisionConflict"]
        assert (await state_rows(dbs[0])) == {**dict.fromkeys(low[:5], 2), **dict.fromkeys(low[5:], 1)}
        assert (await state_rows(dbs[1])) == {**dict.fromkeys(high[:5], 2), **dict.fromkeys(high[5:], 1)}
        got = await store.get(high[0])
        assert got is not None and (got.revision, got.value) == (2, {"pid": high[0], "n": 2})
        await store.delete(high[1], 3)
        await store.delete(low[1], 3)
        assert await store.hard_delete(low[2]) and await store.get(low[2]) is None
        assert low[2] not in await state_rows(dbs[0])

        latest: dict[str, tuple[int, bool]] = {}
        stamps = []
        async for c in store.current_changes_by_slices("Acct", 0, 1023):
            assert c.persistence_id not in latest  # each pid once: its latest revision
            latest[c.persistence_id] = (c.revision, isinstance(c, DeletedState))
            stamps.append(c.db_timestamp)
        assert stamps == sorted(stamps)  # one order over both databases
        expected = {p: (2, False) for p in low[:5] + high[:5]} | {p: (1, False) for p in low[5:] + high[5:]}
        expected |= {high[1]: (3, True), low[1]: (3, True)}
        del expected[low[2]]
        assert latest == expected

        assert await store.delete_tombstones(_far_future(), dry_run=True) == 2
        assert await store.delete_tombstones(_far_future()) == 2
        assert high[1] not in await state_rows(dbs[1]) and low[1] not in await state_rows(dbs[0])


async def test_handlers_and_change_events_run_in_the_database_of_the_pid(parts: list[str]) -> None:
    """An upsert_many over two databases: each database's parts commit with their own handler
    calls, on a connection to that database, and their change events are that database's events."""
    dbs = parts[:2]
    low, high = pids_of("Hand", 0, 511, 3), pids_of("Hand", 512, 1023, 3)
    async with partitioned(dbs, eventual_consistency_delay=0.0) as j:
        store = j.durable_state()
        seen: dict[str, str] = {}

        async def handler(conn: Any, change: Any) -> None:
            seen[change.persistence_id] = await conn.fetchval("SELECT current_database()")

        store.add_change_handler("Hand", handler)
        store.write_change_events("Hand", lambda c: {"value": c.value} if isinstance(c, UpdatedState) else {})
        outcomes = await store.upsert_many([StateWrite(p, 1, {"p": p}) for p in low + high])
        assert all(isinstance(o, StateWritten) for o in outcomes)
        names = [(await stored(d, "SELECT current_database()"))[0][0] for d in dbs]
        assert seen == {**dict.fromkeys(low, names[0]), **dict.fromkeys(high, names[1])}
        for d, mine in zip(dbs, (low, high), strict=True):
            events = await stored(d, "SELECT persistence_id, seq_nr FROM event_journal WHERE entity_type = 'Hand'")
            assert sorted((r[0], r[1]) for r in events) == sorted((p, 1) for p in mine)


def _far_future() -> Any:
    from datetime import UTC, datetime

    return datetime(3000, 1, 1, tzinfo=UTC)


class Upserters:
    """Writers of states, each on pids of its own, each upsert at the next revision: the revision
    acknowledged last per pid (a conflict or a lost answer fails the test)."""

    def __init__(self, store: DurableState, pids: list[str], per: int = 8) -> None:
        self.store, self.pids, self.per = store, pids, per
        self.acked: dict[str, int] = dict.fromkeys(pids, 0)
        self.acks: list[float] = []
        self.failed: list[tuple[str, BaseException]] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        await asyncio.gather(*(self._writer(self.pids[i :: self.per]) for i in range(self.per)))

    def stop(self) -> None:
        self._stop.set()

    async def _writer(self, mine: list[str]) -> None:
        while not self._stop.is_set():
            for pid in mine:
                n = self.acked[pid] + 1
                try:
                    await self.store.upsert(pid, n, {"pid": pid, "n": n})
                except JournalUnavailable as e:
                    self.failed.append((pid, e))
                    return
                self.acked[pid] = n
                self.acks.append(time.monotonic())
            await asyncio.sleep(0.001)


async def follow_changes(store: DurableState, et: str, lo: int, hi: int, seen: dict[str, list[int]]) -> None:
    async for c in store.changes_by_slices(et, lo, hi):
        seen.setdefault(c.persistence_id, []).append(c.revision)


async def test_a_move_carries_the_states_of_its_range_under_upsert_load(parts: list[str]) -> None:
    """Upserts of the range and of the others go on while 512-767 moves to a third database
    (the move on a journal of its own, as the CLI runs it): every acknowledged revision is the
    pid's state after it, the range's states are on the target only, and a live changes query of
    the range saw each pid's revisions only grow, ending at the acknowledged one. Before: the move
    left the states on the source (and the store did not open on a partitioned journal)."""
    dbs, target = parts[:2], parts[2]
    source = dbs[1]
    et = "MoveState"
    moving, staying = pids_of(et, LO, HI, 60), pids_of(et, 0, 511, 30) + pids_of(et, HI + 1, 1023, 30)
    async with partitioned(dbs, eventual_consistency_delay=0.0, query_refresh_interval=0.05) as j:
        store = j.durable_state()
        for p in moving[:5]:  # events of the range too: they move together
            await j.persist(p, [{"n": k} for k in range(3)])
        load = Upserters(store, moving + staying)
        writing = asyncio.create_task(load.run())
        seen: dict[str, list[int]] = {}
        follower = asyncio.create_task(follow_changes(store, et, LO, HI, seen))
        try:
            await wait_until(lambda: len(load.acks) > 2000, 60, "upserts under way")
            mover = await open_partitioned(dbs[0], settings(dbs))
            try:
                report = await SliceMove(mover, LO, HI, target).run()  # type: ignore[arg-type]
            finally:
                await mover.close()
            assert report.states >= len(moving) and report.steps[-1] == "removed from the source"
            moved_at = len(load.acks)
            await wait_until(lambda: len(load.acks) > moved_at + 2000, 60, "upserts after the move")
        finally:
            load.stop()
            await writing
        assert load.failed == []
        try:
            await wait_until(
                lambda: all(seen.get(p, [0])[-1] == load.acked[p] for p in moving), 30, "the changes caught up"
            )
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
        for p in moving:
            revisions = seen[p]
            assert revisions == sorted(set(revisions)), (p, revisions)  # only growing, never twice
        for p in moving + staying:
            got = await store.get(p)
            assert got is not None and (got.revision, got.value) == (load.acked[p], {"pid": p, "n": load.acked[p]})
    on_target = await state_rows(target)
    assert on_target == {p: load.acked[p] for p in moving}
    assert await stored(source, "SELECT 1 FROM durable_state WHERE slice BETWEEN $1 AND $2", LO, HI) == []
    assert await stored(source, "SELECT 1 FROM event_journal WHERE slice BETWEEN $1 AND $2", LO, HI) == []
    assert len(await stored(target, "SELECT 1 FROM event_journal")) == 15


async def test_a_hard_delete_waits_for_a_move_of_its_range(parts: list[str]) -> None:
    """A hard delete during a move's copy (the range ``moving``) would remove a row the copy
    already took: it waits for the move, then deletes where the range is served. Held in the
    copy by a lock on the target's durable_state."""
    dbs, target = parts[:2], parts[2]
    pid = pids_of("HardMove", LO, HI, 1)[0]
    async with partitioned(dbs, eventual_consistency_delay=0.0, fence_wait=60.0) as j:
        store = j.durable_state()
        await store.upsert(pid, 1, {"v": 1})
        c = await asyncpg.connect(_dsn(target))
        await c.execute("BEGIN")
        await c.execute("LOCK TABLE durable_state IN SHARE MODE")
        mover = await open_partitioned(dbs[0], settings(dbs))
        move = asyncio.ensure_future(SliceMove(mover, LO, HI, target).run())  # type: ignore[arg-type]
        try:
            await wait_until(
                lambda: stored(dbs[1], "SELECT 1 FROM slice_partition WHERE state = 'moving'"), 60, "the copy"
            )
            await wait_until(lambda: _waiting_on_lock(target), 30, "the copy held after reading the state")
            deleting = asyncio.ensure_future(store.hard_delete(pid))  # deleting it at the source now would resurrect it
            await c.execute("ROLLBACK")
            await asyncio.wait_for(move, 60)
            assert await asyncio.wait_for(deleting, 60) is True
        finally:
            await c.close()
            if not move.done():
                move.cancel()
            await asyncio.gather(move, return_exceptions=True)
            await mover.close()
        assert await store.get(pid) is None
    assert await state_rows(target) == {} and await state_rows(dbs[1]) == {}


def _dsn(d: str) -> str:
    from journal.postgres import asyncpg_dsn

    return asyncpg_dsn(d)


@pytest.mark.parametrize("step", list(STEPS))
async def test_a_mover_killed_9_leaves_no_state_behind(parts: list[str], step: str) -> None:
    """The mover (a real ``journal partitions move``) killed -9 at its fence, between its switch
    steps, or at its removal, while states of the range and of the others are upserted: the
    range's states are written again within seconds, and after the move is run again every pid
    is at its acknowledged revision, the range's states on the target only."""
    dbs, target = parts[:2], parts[2]
    source = dbs[1]
    et = f"DeadState{step.title()}"
    moving, staying = pids_of(et, LO, HI, 40), pids_of(et, 0, 511, 20) + pids_of(et, HI + 1, 1023, 20)
    db, state = STEPS[step]
    async with partitioned(dbs, eventual_consistency_delay=0.0, fence_wait=FENCE_WAIT) as j:
        store = j.durable_state()
        for p in moving[:10]:  # events of the range: the removal step's first rows
            await j.persist(p, [{"n": k} for k in range(5)])
        await j.save_snapshot(moving[0], 5, {"state": 1})
        load = Upserters(store, moving + staying)
        writing = asyncio.create_task(load.run())
        try:
            await wait_until(lambda: len(load.acks) > 1000, 60, "upserts under way")
            killed_at, _ = await _kill_mover_at(step, {"source": source, "target": target}, dbs, target, db, state)
            before = dict(load.acked)
            back = await wait_until(
                lambda: any(load.acked[p] > before[p] for p in moving), BACK_WITHIN + FENCE_WAIT, "the range upserted"
            )
            assert back and time.monotonic() - killed_at < BACK_WITHIN + 1.0
            rerun = await asyncio.create_subprocess_exec(*move_tool(dbs, target), stdout=PIPE, stderr=PIPE)
            _, err = await asyncio.wait_for(rerun.communicate(), 120)
            assert rerun.returncode == 0, err.decode()
            done = dict(load.acked)
            await wait_until(lambda: all(load.acked[p] > done[p] for p in moving), 30, "every state after the move")
        finally:
            load.stop()
            await writing
        assert load.failed == []
        for p in moving + staying:
            got = await store.get(p)
            assert got is not None and got.revision == load.acked[p], (p, got, load.acked[p])
    assert await state_rows(target) == {p: load.acked[p] for p in moving}
    assert await stored(source, "SELECT 1 FROM durable_state WHERE slice BETWEEN $1 AND $2", LO, HI) == []
    assert await stored(source, "SELECT step FROM slice_move") == []


async def test_a_mover_killed_9_in_the_state_copy_is_given_up_by_a_hard_delete(parts: list[str]) -> None:
    """Killed while it copies the range's states (held by a lock on the target's durable_state):
    the next hard delete of the range gives the move up and goes on within seconds; the move run
    again copies afresh, so the deleted state does not come back from the first copy."""
    dbs, target = parts[:2], parts[2]
    source = dbs[1]
    pids = pids_of("DeadStateCopy", LO, HI, 20)
    async with partitioned(dbs, eventual_consistency_delay=0.0, fence_wait=FENCE_WAIT) as j:
        store = j.durable_state()
        for p in pids:
            await store.upsert(p, 1, {"p": p})
        await kill_mover_in_its_copy(dbs, target, "LOCK TABLE durable_state IN SHARE MODE")
        await store.upsert(pids[1], 2, {"p": pids[1]})  # upserts go on meanwhile
        started = time.monotonic()
        assert await store.hard_delete(pids[0])
        assert time.monotonic() - started < BACK_WITHIN
        assert await stored(source, "SELECT 1 FROM slice_move") == []
        rerun = await asyncio.create_subprocess_exec(*move_tool(dbs, target), stdout=PIPE, stderr=PIPE)
        _, err = await asyncio.wait_for(rerun.communicate(), 120)
        assert rerun.returncode == 0, err.decode()
        assert await store.get(pids[0]) is None
    assert await state_rows(target) == {pids[1]: 2, **{p: 1 for p in pids[2:]}}
    assert await state_rows(source) == {}


async def test_additional_columns_follow_their_state(parts: list[str]) -> None:
    """An additional column of durable_state must be in every database (refused when added
    otherwise, naming the one without it); it is written in the database of the pid's slice and
    moves with the state. A table of its own is refused on a partitioned journal."""
    dbs, target = parts[:2], parts[2]
    col = AdditionalColumn("Col", "total", lambda c: c.value["n"] if isinstance(c, UpdatedState) else None)
    pids = pids_of("Col", 0, 511, 3) + pids_of("Col", LO, HI, 3)
    try:
        await _alter(dbs[0], "ADD COLUMN total int")
        async with partitioned(dbs, eventual_consistency_delay=0.0) as j:
            store = j.durable_state()
            with pytest.raises(ConfigurationError, match=r"durable_state has no column 'total' in .*sjpart"):
                await store.add_columns(col)
            with pytest.raises(ConfigurationError, match="a table of its own is not supported on a partitioned"):
                await store.add_columns(AdditionalColumn("Col", "items", lambda c: 1, table="col_items"))
            for d in parts[1:]:
                await _alter(d, "ADD COLUMN total int")
            await store.add_columns(col)
            for k, p in enumerate(pids):
                await store.upsert(p, 1, {"n": k})
            mover = await open_partitioned(dbs[0], settings(dbs))
            try:
                await SliceMove(mover, LO, HI, target).run()  # type: ignore[arg-type]
            finally:
                await mover.close()
            await store.upsert(pids[-1], 2, {"n": 50})  # written on the target now
        totals = {
            d: {r[0]: r[1] for r in await stored(d, "SELECT persistence_id, total FROM durable_state")}
            for d in parts[:3]
        }
        assert totals[dbs[0]] == {p: k for k, p in enumerate(pids[:3])}
        assert totals[dbs[1]] == {}
        assert totals[target] == {pids[3]: 3, pids[4]: 4, pids[5]: 50}
    finally:
        for d in parts:
            await _alter(d, "DROP COLUMN IF EXISTS total")


async def _alter(dsn: str, what: str) -> None:
    conn = await asyncpg.connect(_dsn(dsn))
    try:
        await conn.execute(f"ALTER TABLE durable_state {what}")
    finally:
        await conn.close()
