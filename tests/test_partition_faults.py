"""Faults of a journal over several databases, on real servers: one database crashed mid-load,
a move whose tool is killed -9, a projection across databases with a worker killed and rescaled.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import asyncpg
from projection_helpers import spawn_worker, stop
from test_partitions import partitioned

from journal import Journal, JournalUnavailable, slice_for
from journal.postgres.dsn import asyncpg_dsn
from projections.demo.cart import prepare, projected_count, verify
from tests.support.private_server import crash
from tests.support.waiting import wait_until

OUTAGE = dict(attempts=2, initial_backoff=0.02, max_backoff=0.1, connect_timeout=1.0)
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
            await wait_until(lambda: load.unavailable["high"] > 0, 30, "the down database's slices refused")
            low, high, projected = load.written["low"], load.written["high"], await projected_count(c, et)
            # the other database's slices keep writing and projecting
            await wait_until(lambda: load.written["low"] > low + 200, 30, "low slices writing during the outage")
            await wait_until(lambda: _projected(c, et, projected + 200), 60, "projecting during the outage")
            assert load.written["high"] <= high + 3  # (a write or so already past the crash)
            from tests.partition_fixtures import running

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
