"""Conditional requests: a command or query waits until the view or entity has seen the vector
time a write returned (read-your-writes across components), or fails with ConditionTimeout."""

from __future__ import annotations

import asyncio

import pytest

from journal import ConditionTimeout, EntityRegistry, EventRouter, InvalidArgument, Journal, VectorTime
from tests.routing_fixtures import Account, Order, OrderCount


async def test_read_your_writes_through_a_view_under_concurrency(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg, OrderCount(journal) as view:

        async def client(k: int) -> None:
            for i in range(10):
                w = await reg.ask_timed(Order, f"o{k}", ("place", i, []))
                assert w.vector_time == VectorTime({f"order|o{k}": w.reply})
                # always sees its own write, however far behind the view is
                assert await view.ask(f"order|o{k}", after=w.vector_time, timeout=30) >= w.reply

        await asyncio.gather(*(client(k) for k in range(16)))
        assert view.applied <= 160


async def test_read_your_writes_through_routing_into_an_entity(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg, EventRouter(reg, ["order"]):
        reg.register(Account)

        async def client(k: int) -> None:
            for i in range(5):
                w = await reg.ask_timed(Order, f"o{k}", ("place", f"{k}-{i}", ["account|a"]))
                state = await reg.ask(Account, "a", ("read",), after=w.vector_time, timeout=30)
                assert [f"{k}-{i}", [f"order|o{k}", w.reply]] in state

        await asyncio.gather(*(client(k) for k in range(8)))
        state = await reg.ask(Account, "a", ("read",))
    assert len(state) == 40
    for k in range(8):  # in order per source
        assert [e for e, _ in state if e.startswith(f"{k}-")] == [f"{k}-{i}" for i in range(5)]


async def test_a_query_only_command_returns_the_time_it_saw(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg:
        await reg.ask(Order, "q", ("place", "x", []))
        w = await reg.ask_timed(Order, "q", ("read",))
        assert (w.reply, w.vector_time) == (["x"], VectorTime({"order|q": 1}))
        fresh = await reg.ask_timed(Order, "empty", ("read",))
        assert fresh.vector_time == VectorTime()


async def test_a_time_never_reached_raises_condition_timeout_and_runs_nothing(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg, OrderCount(journal) as view:
        with pytest.raises(ConditionTimeout) as e:
            await view.ask("all", after={"order|never": 1}, timeout=0.3)
        assert e.value.missing == {"order|never": (1, 0)}
        with pytest.raises(ConditionTimeout):
            await reg.ask(Account, "a", ("add", "not written"), after={"account|a": 1}, timeout=0.3)
        assert await journal.highest_seq_nr("account|a") == 0
        assert isinstance(e.value, TimeoutError)


async def test_bad_conditions_are_refused(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg, OrderCount(journal) as view:
        for after, timeout in (("x", 1.0), ({"": 1}, 1.0), ({"order|a": -1}, 1.0), ({"order|a": 1}, 0), (None, -2)):
            with pytest.raises(InvalidArgument):
                await view.ask("all", after=after, timeout=timeout)  # type: ignore[arg-type]
            with pytest.raises(InvalidArgument):
                await reg.ask(Account, "a", ("add", "no"), after=after, timeout=timeout)  # type: ignore[arg-type]
    assert await journal.highest_seq_nr("account|a") == 0
