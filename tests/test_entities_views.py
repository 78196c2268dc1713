"""Event-sourced views: in-memory state from the events of entity types and aggregates (routed
copies included), snapshots with the offsets they cover, restarts that apply nothing twice."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from journal import ConfigurationError, EntityRegistry, EventRouter, Journal, VectorTime, View
from journal.entities.view import VIEW_TYPE
from tests.routing_fixtures import Account, Order, OrderCount, Trail

ROOT = Path(__file__).resolve().parents[1]


async def test_a_view_reads_entity_types_and_aggregates_with_routed_copies(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg, EventRouter(reg, ["order"]), OrderCount(journal) as view:
        reg.register(Account)
        await reg.ask(Order, "o1", ("place", "a1", ["account|a"]))
        await reg.ask(Order, "o1", ("place", "b1", ["account|b"]))
        last = await reg.ask_timed(Order, "o2", ("place", "a2", ["account|a"]))
        await reg.ask(Account, "b", ("add", "own b"))  # account|b: not subscribed
        own = await reg.ask_timed(Account, "a", ("add", "own a"), after=last.vector_time, timeout=20)
        # seen: the routed copy of order|o2#1 (in account|a) and account|a's own event
        seen = await view.ask("account|a", after=last.vector_time.merge(own.vector_time), timeout=20)
        assert seen == 3
        # order|o3 is read after the other orders (a later write): then they are all counted
        late = await reg.ask_timed(Order, "o3", ("place", "z", []))
        counts = await view.ask("all", after=late.vector_time, timeout=20)
        assert counts == {"order|o1": 2, "order|o2": 1, "order|o3": 1, "account|a": 3}
        assert view.vector_time >= VectorTime({"order|o1": 2, "order|o2": 1, "account|a": 3})
        assert view.applied == 7


async def test_a_view_restarted_from_a_snapshot_applies_nothing_twice(journal: Journal, dsn: str) -> None:
    expected: list[list[Any]] = []
    async with EntityRegistry(journal) as reg:

        async def write(first: int, last: int) -> VectorTime:
            vt = VectorTime()
            for i in range(first, last):
                pid = f"o{i % 5}"
                w = await reg.ask_timed(Order, pid, ("place", i, []))
                expected.append([f"order|{pid}", w.reply])
                vt = vt.merge(w.vector_time)
            return vt

        vt = await write(0, 30)
        async with Trail(journal) as view:
            assert await view.ask("all", after=vt, timeout=20) == expected
            await view.save_snapshot()
        vt = vt.merge(await write(30, 50))
        async with Trail(journal) as again:  # a new instance: snapshot, then only later events
            state = await again.ask("all", after=vt, timeout=20)
            assert state == expected
            assert again.applied == 50
        await write(50, 60)
        after = json.dumps(dict(vt.merge(await write(60, 61))))
    # a new process starts from the same snapshot (taken at 30 events)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.view_worker", dsn, after,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        raise AssertionError(f"view worker hung: {out.decode()} {err.decode()}") from None
    assert proc.returncode == 0, err.decode()
    result = json.loads(out)
    assert result["state"] == expected
    assert result["applied"] == 61


async def test_automatic_snapshots_and_a_view_that_fails(journal: Journal) -> None:
    class Every2(Trail):
        view_id = "every2"
        snapshot_every = 2

    class Failing(Trail):
        view_id = "failing"

        def on_event(self, state: list[Any], event: Any) -> list[Any]:
            if event == "poison":
                raise RuntimeError("cannot apply poison")
            return super().on_event(state, event)

    async with EntityRegistry(journal) as reg:
        for i in range(5):
            await reg.ask(Order, "o", ("place", i, []))
        async with Every2(journal) as view:
            await view.ask("all", after={"order|o": 5}, timeout=20)
        snap = await journal.load_snapshot(f"{VIEW_TYPE}|every2")
        assert snap is not None and len(snap.state) in (2, 4)  # the last multiple of 2 written
        await reg.ask(Order, "o", ("place", "poison", []))
        async with Failing(journal) as failing:
            with pytest.raises(Exception, match="cannot apply poison"):
                await failing.ask("all", after={"order|o": 6}, timeout=20)


def test_view_configuration_is_checked(journal: Journal) -> None:
    class NoId(View[int]):
        entity_types = ("order",)

    class ReadsNothing(View[int]):
        view_id = "nothing"

    class BadAggregate(View[int]):
        view_id = "bad"
        aggregate_ids = ("no-type",)

    for cls in (NoId, ReadsNothing, BadAggregate):
        with pytest.raises(ConfigurationError):
            cls(journal)
