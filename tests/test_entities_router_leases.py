"""Routers in several processes share the source slices through leases (as projection workers):
one, then three, one of them killed with -9 (its slices taken over once its leases expire), a new
one, then scaled down to one, all while orders are placed. Every routed copy is in its destination
exactly once, in order per source."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from journal import EntityRegistry, Journal, routed_from
from journal.postgres.leases import LeaseSql
from tests.router_worker import start_router
from tests.routing_fixtures import Order
from tests.support.waiting import wait_until

LEASES = LeaseSql("public")
ROUTER = "shared"
DESTS = 6


def start(dsn: str) -> Any:
    return start_router(dsn, "0.3", ROUTER, "3.0", "0.5")


async def owners(dsn: str) -> dict[str, int]:
    """Live lease owner -> slices it holds."""
    conn = await asyncpg.connect(dsn)
    try:
        out: dict[str, int] = {}
        for r in await LEASES.lease_owners(conn, f"sj_router|{ROUTER}"):
            if r["live"] and r["owner"]:
                out[r["owner"]] = out.get(r["owner"], 0) + 1
        return out
    finally:
        await conn.close()


def shared_by(n: int, dsn: str) -> object:
    async def check() -> bool:
        got = await owners(dsn)
        return len(got) == n and sum(got.values()) == 1024

    return check


@pytest.fixture
def procs() -> Iterator[list[asyncio.subprocess.Process]]:
    started: list[asyncio.subprocess.Process] = []
    yield started
    for p in started:
        if p.returncode is None:
            p.kill()


async def test_routers_share_slices_rescale_and_take_over_a_killed_one(
    journal: Journal, dsn: str, procs: list[asyncio.subprocess.Process]
) -> None:
    expected: dict[str, dict[str, list[int]]] = {}
    stop = asyncio.Event()
    async with EntityRegistry(journal) as reg:

        async def place() -> None:
            i = 0
            while not stop.is_set():
                src, dest = f"o{i % 24}", f"account|{i % DESTS}"
                n = await reg.ask(Order, src, ("place", f"item {i}", [dest]))
                expected.setdefault(dest, {}).setdefault(f"order|{src}", []).append(n)
                i += 1
                await asyncio.sleep(0.005)  # the application's pace

        load = asyncio.create_task(place())
        try:
            procs.append(await start(dsn))
            await wait_until(shared_by(1, dsn), 60, "one router holding every slice", every=0.2)
            procs.extend([await start(dsn), await start(dsn)])
            await wait_until(shared_by(3, dsn), 60, "three routers sharing the slices", every=0.2)
            procs[1].send_signal(signal.SIGKILL)  # no release: its leases expire
            await procs[1].wait()
            await wait_until(shared_by(2, dsn), 60, "the killed router's slices taken over", every=0.2)
            procs.append(await start(dsn))
            await wait_until(shared_by(3, dsn), 60, "a new router getting its share", every=0.2)
            for p in (procs[0], procs[2]):  # scaled down: they give their slices up
                p.send_signal(signal.SIGTERM)
                await p.wait()
                assert p.returncode == 0
            await wait_until(shared_by(1, dsn), 60, "the last router holding every slice", every=0.2)
        finally:
            stop.set()
            await load

    async def all_delivered() -> bool:
        for dest, per_source in expected.items():
            if await journal.highest_seq_nr(dest) < sum(len(v) for v in per_source.values()):
                return False
        return True

    await wait_until(all_delivered, 120, "every copy delivered", every=0.2)
    for dest, per_source in expected.items():
        got: dict[str, list[int]] = {}
        async for e in journal.current_events_by_persistence_id(dest):
            src = routed_from(e)
            assert src is not None
            got.setdefault(src[0], []).append(src[1])
        assert got == per_source, f"{dest}: copies missing, doubled or out of order"
