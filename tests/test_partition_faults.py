"""Faults of a journal over several databases, on real servers: one database crashed mid-load,
a move whose tool is killed -9, a projection across databases with a worker killed and rescaled.
"""

from __future__ import annotations

import asyncio
import random
import signal
import sys
from asyncio.subprocess import DEVNULL, PIPE
from typing import Any

import asyncpg
import pytest
from projection_helpers import spawn_worker, stop
from test_partitions import partitioned, settings, stored

from journal import Journal, JournalUnavailable, Write, slice_for
from journal.backends import open_partitioned
from journal.partitioned.move import SliceMove
from journal.postgres import asyncpg_dsn
from projections.demo.cart import CartWorkload, prepare, projected_count, verify
from projections.postgres_store import ProjectionSql
from tests.partition_fixtures import running
from tests.support.private_server import crash
from tests.support.waiting import wait_until

OUTAGE = dict(attempts=2, initial_backoff=0.02, max_backoff=0.1, connect_timeout=1.0)
SQL = ProjectionSql("public")
WORKER_OUTAGE = {"JOURNAL_RETRY_ATTEMPTS": "2", "JOURNAL_CONNECT_TIMEOUT": "1"}


class Load:
    """Writers of one event per call to pids of the low half (database 0) and the high half
    (database 1): what each half wrote and how often it was refused as unavailable."""

    def __init__(self, j: Journal, et: str) -> None:
        self.j = j
        pids = [f"{et}|{i:x}{i * 7919:x}" for i in range(400)]
        self.halves = {
            "low": [p for p in pids if slice_for(p) < 512][:40],
            "high": [p for p in pids if slice_for(p) >= 512][:40],
        }
        self.written = {"low": 0, "high": 0}
        self.unavailable = {"low": 0, "high": 0}
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        await asyncio.gather(*(self._writer(h, k) for h in self.halves for k in range(3)))

    async def _writer(self, half: str, k: int) -> None:
        rng = random.Random(k)
        mine = self.halves[half][k::3]
        while not self._stop.is_set():
            ev: dict[str, Any] = {"type": "ItemAdded", "item": f"sku-{rng.randrange(9)}", "qty": 1}
            try:
                await self.j.persist(rng.choice(mine), [ev])
                self.written[half] += 1
            except JournalUnavailable:
                self.unavailable[half] += 1
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.002)


async def test_one_database_down_the_others_write_and_project(parts: list[str], pg_servers: list[Any]) -> None:
    home, other = parts[0], parts[1]  # servers 0 and 1
    et, name = "DownCart", "p-down"
    c = await asyncpg.connect(asyncpg_dsn(home))
    await prepare(c)
    await c.execute("TRUNCATE demo_cart_projected, demo_cart_view")
    env = {"JOURNAL_DATABASES": f"{home} {other}", **WORKER_OUTAGE}
    async with partitioned([home, other], eventual_consistency_delay=0.0, **OUTAGE) as j:
        load = Load(j, et)
        writing = asyncio.create_task(load.run())
        worker = [spawn_worker(home, name, et, env=env)]
        try:
            await wait_until(lambda: _projected(c, et, 200), 60, "the projection under way")
            crash(pg_servers[1])
            try:
                await wait_until(lambda: load.unavailable["high"] > 0, 30, "the down database's slices refused")
                low, high, projected = load.written["low"], load.written["high"], await projected_count(c, et)
                # the other database's slices keep writing and projecting
                await wait_until(lambda: load.written["low"] > low + 200, 30, "low slices writing during the outage")
                await wait_until(lambda: _projected(c, et, projected + 200), 60, "projecting during the outage")
                assert load.written["high"] <= high + 3  # (a write or so already past the crash)
            finally:
                await running(pg_servers[1])
            high = load.written["high"]
            await wait_until(lambda: load.written["high"] > high + 100, 60, "the down slices writing again")
        finally:
            load.stop()
            await writing
        try:
            total = sum(load.written.values())
            await wait_until(lambda: _projected(c, et, total), 90, "the projection caught up")
        finally:
            stop(worker)
        v = await verify(j, c, et)
        assert (v.missing, v.duplicates, v.view_mismatches) == (0, 0, 0) and v.written >= total
    await c.close()


async def _projected(c: asyncpg.Connection, et: str, n: int) -> bool:
    return await projected_count(c, et) >= n


LO, HI = 512, 767


def move_tool(databases: list[str], target: str) -> list[str]:
    return [
        sys.executable, "-m", "journal", "partitions", "move", "--slices", f"{LO}-{HI}", "--to", target,
        "--databases", " ".join(databases), "--dsn", databases[0],
    ]  # fmt: skip


async def test_a_move_killed_9_finishes_when_run_again(parts: list[str]) -> None:
    dbs, target = parts[:2], parts[2]
    et = "KillMove"
    pids = [p for p in (f"{et}|{i:x}{i * 7919:x}" for i in range(2000)) if LO <= slice_for(p) <= HI][:200]
    async with partitioned(dbs, eventual_consistency_delay=0.0) as j:
        for k in range(0, 150, 30):  # 30,000 events in the range: the copy takes a while
            await j.persist_many([Write(p, [{"n": n} for n in range(k, k + 30)]) for p in pids])
        load = Load(j, et)
        load.halves = {"low": pids[:60], "high": pids[60:120]}  # every writer in the moved range
        writing = asyncio.create_task(load.run())
        try:
            tool = await asyncio.create_subprocess_exec(*move_tool(dbs, target), stdout=DEVNULL, stderr=DEVNULL)
            copying = "SELECT count(*) FROM event_journal"
            await wait_until(lambda: _some(target, copying), 60, "the copy under way", every=0.005)
            tool.send_signal(signal.SIGKILL)
            await tool.wait()
            unfinished = await stored(dbs[1], "SELECT step FROM slice_move")
            assert unfinished, "the move finished before the kill"
            rerun = await asyncio.create_subprocess_exec(*move_tool(dbs, target), stdout=PIPE, stderr=PIPE)
            out, err = await asyncio.wait_for(rerun.communicate(), 120)
            assert rerun.returncode == 0, err.decode()
            assert "resumed at step" in out.decode()
            written = sum(load.written.values())
            await wait_until(lambda: sum(load.written.values()) > written + 100, 30, "writes going on after it")
        finally:
            load.stop()
            await writing
        expected = {(p, n) for p in pids async for n in _seq_nrs(j, p)}
        assert len(expected) == 150 * len(pids) + sum(load.written.values())  # nothing lost or doubled
    rows = await stored(target, "SELECT persistence_id, seq_nr FROM event_journal")
    assert sorted((r[0], r[1]) for r in rows) == sorted(expected)
    assert await stored(dbs[1], "SELECT 1 FROM event_journal WHERE slice BETWEEN $1 AND $2", LO, HI) == []
    assert await stored(dbs[1], "SELECT step FROM slice_move") == []


async def _some(dsn: str, sql: str) -> bool:
    return bool((await stored(dsn, sql))[0][0])


async def _seq_nrs(j: Journal, pid: str) -> Any:
    async for e in j.current_events_by_persistence_id(pid):
        yield e.seq_nr


async def test_a_projection_across_databases_survives_kill_9_and_rescale(
    parts: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    home = parts[0]
    et, name = "SpanCart", "p-span"
    monkeypatch.setenv("JOURNAL_DATABASES", " ".join(parts))  # the workers' journal: four databases
    c = await asyncpg.connect(asyncpg_dsn(home))
    await prepare(c)
    await c.execute("TRUNCATE demo_cart_projected, demo_cart_view")
    async with partitioned(parts, eventual_consistency_delay=0.0) as j:
        load = CartWorkload(j, et, 3000, 8, rate=500)  # carts check out: enough for a minute
        writing = asyncio.create_task(load.run())
        procs = [spawn_worker(home, name, et), spawn_worker(home, name, et)]
        try:
            await wait_until(lambda: _owners(c, name, 2), 60, "two workers sharing the slices")
            await wait_until(lambda: _projected(c, et, 500), 30, "projection under way")
            procs[0].send_signal(signal.SIGKILL)  # mid-batch: its transaction rolls back
            procs[0].wait()
            await wait_until(lambda: _owners(c, name, 1), 60, "takeover by the survivor")
            procs += [spawn_worker(home, name, et), spawn_worker(home, name, et)]  # rescale to 3
            await wait_until(lambda: _owners(c, name, 3), 60, "three workers owning slices")
            for p in procs[1:3]:
                p.send_signal(signal.SIGTERM)  # and down to 1
            await wait_until(lambda: _owners(c, name, 1), 60, "one worker owning slices")
            written = load.written
            await wait_until(lambda: _projected(c, et, written), 30, "one worker catching up after the rescale")
        finally:
            load.stop()
            await writing
        try:
            await wait_until(lambda: _projected(c, et, load.written), 60, "the projection caught up")
        finally:
            stop(procs)
        v = await verify(j, c, et)
        assert (v.written, v.missing, v.duplicates, v.view_mismatches) == (load.written, 0, 0, 0)
    await c.close()


async def _owners(c: asyncpg.Connection, name: str, n: int) -> bool:
    rows = await SQL.leases.lease_owners(c, name)
    return len({r["owner"] for r in rows if r["live"]}) == n and all(r["live"] for r in rows)


async def test_a_move_interrupted_by_a_database_crash_finishes_when_run_again(
    parts: list[str], pg_servers: list[Any]
) -> None:
    dbs, target = parts[:2], parts[2]  # the target on the third server
    et = "CrashMove"
    pids = [p for p in (f"{et}|{i:x}{i * 7919:x}" for i in range(2000)) if LO <= slice_for(p) <= HI][:200]
    async with partitioned(dbs, **OUTAGE) as j:
        for k in range(0, 150, 30):
            await j.persist_many([Write(p, [{"n": n} for n in range(k, k + 30)]) for p in pids])
        mover = await open_partitioned(dbs[0], settings(dbs, **OUTAGE))
        try:
            moving = asyncio.create_task(SliceMove(mover, LO, HI, target).run())
            copying = "SELECT count(*) FROM event_journal"
            await wait_until(lambda: _some(target, copying), 60, "the copy under way", every=0.005)
            crash(pg_servers[2])
            try:
                with pytest.raises(JournalUnavailable):
                    await moving
            finally:
                await running(pg_servers[2])
        finally:
            await mover.close()
        await j.persist(pids[0], [{"n": "meanwhile"}])  # the source still serves the range
        mover = await open_partitioned(dbs[0], settings(dbs))
        try:
            report = await SliceMove(mover, LO, HI, target).run()
        finally:
            await mover.close()
        assert report.resumed_from == "moving"
        expected = {(p, n) for p in pids async for n in _seq_nrs(j, p)}
        assert len(expected) == 150 * len(pids) + 1
        assert await j.highest_seq_nr(pids[0]) == 151
    rows = await stored(target, "SELECT persistence_id, seq_nr FROM event_journal")
    assert sorted((r[0], r[1]) for r in rows) == sorted(expected)
    assert await stored(dbs[1], "SELECT 1 FROM event_journal WHERE slice BETWEEN $1 AND $2", LO, HI) == []
