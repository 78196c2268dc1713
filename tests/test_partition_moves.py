"""Moving a slice range to another database while the journal runs, on real servers.

Writes go on, four live queries and a projection worker (a real subprocess) follow, and the
range 512-767 moves from the second database to a third one: nothing is missed or repeated,
every pid's events are in order on the new database, the old one keeps none of the range, and
a process whose map predates the move is refused there and follows the range.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import asyncpg
import pytest
from projection_helpers import spawn_worker, stop
from test_partitions import partitioned, settings, stored

from journal import Journal, SliceRangeMoved, slice_for
from journal.backends import open_partitioned
from journal.partitioned.move import SliceMove
from journal.postgres import PostgresBackend, asyncpg_dsn
from journal.settings import JournalSettings
from projections.demo.cart import CartWorkload, prepare, projected_count, verify
from tests.support.waiting import wait_until

QUARTERS = [(0, 255), (256, 511), (512, 767), (768, 1023)]
LO, HI = 512, 767


async def follow(j: Journal, et: str, lo: int, hi: int, seen: list[tuple[str, int]]) -> None:
    async for e in j.events_by_slices(et, lo, hi):
        seen.append((e.persistence_id, e.seq_nr))


def in_order(seen: list[tuple[str, int]]) -> bool:
    """Each pid's events once each, 1, 2, 3, ... in the order delivered."""
    last: dict[str, int] = defaultdict(int)
    for pid, n in seen:
        if n != last[pid] + 1:
            return False
        last[pid] = n
    return True


async def test_a_move_under_write_load_misses_and_repeats_nothing(parts: list[str]) -> None:
    home, source, target = parts[0], parts[1], parts[2]
    et, name = "MoveCart", "p-move"
    c = await asyncpg.connect(asyncpg_dsn(home))
    await prepare(c)
    await c.execute("TRUNCATE demo_cart_projected, demo_cart_view")
    fast = dict(eventual_consistency_delay=0.0, query_refresh_interval=0.05)
    async with partitioned([home, source], **fast) as j, partitioned([home, source], **fast) as stale:
        load = CartWorkload(j, et, 200, 8, rate=800)
        writing = asyncio.create_task(load.run())
        seen: list[list[tuple[str, int]]] = [[] for _ in QUARTERS]
        consumers = [asyncio.create_task(follow(j, et, lo, hi, s)) for (lo, hi), s in zip(QUARTERS, seen, strict=True)]
        worker = [spawn_worker(home, name, et, env={"JOURNAL_DATABASES": f"{home} {source}"})]
        try:
            await wait_until(lambda: projected_count(c, et), 60, "the projection under way")
            report = await SliceMove(j.backend, LO, HI, target).run()  # type: ignore[arg-type]
            assert report.steps[-1] == "removed from the source" and report.rows > 0
            moved_at = load.written
            await wait_until(lambda: load.written > moved_at + 300, 30, "writes going on after the move")
        finally:
            load.stop()
            await writing
        try:
            await wait_until(lambda: _projected_all(c, et, load.written), 60, "the projection caught up")
            await wait_until(lambda: sum(map(len, seen)) >= load.written, 30, "the live queries caught up")
        finally:
            stop(worker)
            for t in consumers:
                t.cancel()
            await asyncio.gather(*consumers, return_exceptions=True)
        v = await verify(j, c, et)
        assert (v.written, v.missing, v.duplicates, v.view_mismatches) == (load.written, 0, 0, 0)
        everything = {k for s in seen for k in s}
        assert sum(map(len, seen)) == len(everything) == load.written  # 0 missing, 0 duplicates
        assert all(in_order(s) for s in seen)
        # the range is on the new database only, every pid's events there in order
        rows = await stored(target, "SELECT persistence_id, seq_nr FROM event_journal ORDER BY persistence_id, seq_nr")
        moved = {k for k in everything if LO <= slice_for(k[0]) <= HI}
        assert moved and {(r[0], r[1]) for r in rows} == moved
        assert in_order([(r[0], r[1]) for r in rows])
        assert await stored(source, "SELECT 1 FROM event_journal WHERE slice BETWEEN $1 AND $2", LO, HI) == []
        # a process whose map is older than the move: refused where the range was, it follows it
        assert stale.backend.dbs.map.epoch == 0  # type: ignore[attr-defined]
        pid = next(p for p in (f"{et}|stale-{i}" for i in range(100)) if LO <= slice_for(p) <= HI)
        await stale.persist(pid, [{"type": "ItemAdded", "item": "x", "qty": 1}])
        assert stale.backend.dbs.map.epoch == report.epoch  # type: ignore[attr-defined]
        assert await stored(target, "SELECT seq_nr FROM event_journal WHERE persistence_id = $1", pid) != []
        assert await stored(source, "SELECT seq_nr FROM event_journal WHERE persistence_id = $1", pid) == []
    # and a writer of the old place that never reloads (one database's backend at epoch 0) is refused there
    old = PostgresBackend(source, JournalSettings.load(env={}, dsn=source))
    await old.start()
    with_old = Journal(old, old.settings)
    try:
        old.use_epoch(0)
        with pytest.raises(SliceRangeMoved) as refused:
            await with_old.persist(pid, [{"n": 2}], expected_seq_nr=1)
        assert refused.value.state == "moved" and refused.value.location is not None
    finally:
        await with_old.close()
        await old.close()
    assert await stored(source, "SELECT 1 FROM event_journal WHERE persistence_id = $1", pid) == []
    await c.close()


async def _projected_all(c: asyncpg.Connection, et: str, n: int) -> bool:
    return await projected_count(c, et) >= n


async def test_writers_with_expected_seq_nr_follow_a_move_run_by_another_process(parts: list[str]) -> None:
    """The move runs on a backend of its own (as `journal partitions move` does): the writers'
    journal learns of it only from the databases' refusals, and no call conflicts."""
    dbs, target = parts[:2], parts[2]
    pids = [p for p in (f"seq|{i}x{i * 7919}" for i in range(400)) if LO <= slice_for(p) <= HI][:20]
    async with partitioned(dbs) as j:
        stop = asyncio.Event()
        highest = dict.fromkeys(pids, 0)

        async def writer(pid: str) -> None:
            while not stop.is_set():
                await j.persist(pid, [{"n": highest[pid]}], expected_seq_nr=highest[pid])  # a conflict raises
                highest[pid] += 1
                await asyncio.sleep(0)

        writing = asyncio.gather(*(writer(p) for p in pids))
        try:
            await wait_until(lambda: sum(highest.values()) > 1000, 30, "writes under way")
            mover = await open_partitioned(dbs[0], settings(dbs))
            try:
                await SliceMove(mover, LO, HI, target).run()
            finally:
                await mover.close()
            moved_at = sum(highest.values())
            await wait_until(lambda: sum(highest.values()) > moved_at + 500, 30, "writes after the move")
        finally:
            stop.set()
            await writing
        assert j.backend.dbs.map.epoch == 1  # type: ignore[attr-defined]
    rows = await stored(target, "SELECT persistence_id, max(seq_nr), count(*) FROM event_journal GROUP BY 1")
    assert {r[0]: (r[1], r[2]) for r in rows} == {p: (n, n) for p, n in highest.items()}
