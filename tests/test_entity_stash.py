"""Command stashing and behaviour changes (become/unbecome) on a real PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from journal import EntityRegistry, EntityStopped, InvalidArgument, Journal
from tests.entity_fixtures import Booking, LazyBooking
from tests.support.waiting import wait_until


@pytest.fixture
async def registry(journal: Journal) -> AsyncIterator[EntityRegistry]:
    async with EntityRegistry(journal) as reg:
        yield reg


async def stored(journal: Journal, pid: str) -> list[object]:
    return [e.event async for e in journal.current_events_by_persistence_id(pid)]


@pytest.mark.parametrize("cls", [Booking, LazyBooking], ids=["stateSync", "no-stateSync"])
async def test_commands_wait_stashed_until_the_confirmation_then_run_in_order(
    registry: EntityRegistry, journal: Journal, cls: type[Booking]
) -> None:
    pid = f"{cls.entity_type}|b1"
    assert await registry.ask(cls, "b1", ("reserve", "r1")) == ["requested r1"]
    # while waiting: a second reservation and a read are stashed, their replies pending
    second = asyncio.ensure_future(registry.ask(cls, "b1", ("reserve", "r2")))
    read = asyncio.ensure_future(registry.ask(cls, "b1", ("read",)))
    await wait_until(lambda: len(registry._cells[pid]._stash) == 2, timeout=30)
    assert not second.done() and not read.done()
    assert await stored(journal, pid) == ["requested r1"]
    # the confirmation runs first, then the stashed commands in stash order under the old handler
    assert await registry.ask(cls, "b1", ("confirm", "r1")) == ["requested r1", "confirmed r1"]
    assert await asyncio.wait_for(second, 30) == ["requested r1", "confirmed r1", "requested r2"]
    # "reserve r2" made it wait again, so the unstashed read went back to the stash
    await wait_until(lambda: len(registry._cells[pid]._stash) == 1, timeout=30)
    assert not read.done()
    await registry.ask(cls, "b1", ("confirm", "r2"))
    everything = ["requested r1", "confirmed r1", "requested r2", "confirmed r2"]
    # without stateSync the read runs before "confirmed r2" is written and applied
    assert await asyncio.wait_for(read, 30) == (everything if cls.state_sync is None else everything[:3])
    assert await stored(journal, pid) == everything


async def test_a_failing_handler_changes_no_behaviour_and_a_stashed_command_cannot_persist(
    registry: EntityRegistry, journal: Journal
) -> None:
    await registry.ask(Booking, "b2", ("reserve", "r1"))
    with pytest.raises(ValueError, match="behaviour unchanged"):
        await registry.ask(Booking, "b2", ("cancel_wait_and_fail",))
    with pytest.raises(InvalidArgument, match="stashed command cannot persist"):
        await registry.ask(Booking, "b2", ("stash_and_persist",))
    # still waiting for the confirmation: a read is stashed, then answered after it
    read = asyncio.ensure_future(registry.ask(Booking, "b2", ("read",)))
    await registry.ask(Booking, "b2", ("confirm", "r1"))
    assert await asyncio.wait_for(read, 30) == ["requested r1", "confirmed r1"]
    assert await stored(journal, "booking|b2") == ["requested r1", "confirmed r1"]


async def test_stashed_commands_fail_when_the_entity_stops(journal: Journal) -> None:
    async with EntityRegistry(journal) as registry:
        await registry.ask(Booking, "b3", ("reserve", "r1"))
        read = asyncio.ensure_future(registry.ask(Booking, "b3", ("read",)))
        await wait_until(lambda: len(registry._cells["booking|b3"]._stash) == 1, timeout=30)
    with pytest.raises(EntityStopped):
        await asyncio.wait_for(read, 30)
    # a new instance recovers the state and starts with on_command again
    async with EntityRegistry(journal) as registry:
        assert await registry.ask(Booking, "b3", ("read",)) == ["requested r1"]


async def test_a_stash_whose_callers_gave_up_does_not_keep_the_entity_alive(registry: EntityRegistry) -> None:
    await registry.ask(Booking, "b4", ("reserve", "r1"))
    read = asyncio.ensure_future(registry.ask(Booking, "b4", ("read",)))
    await wait_until(lambda: len(registry._cells["booking|b4"]._stash) == 1, timeout=30)
    assert await registry.passivate_idle(older_than=0) == 0  # a caller is waiting: stays
    read.cancel()
    await wait_until(lambda: registry._cells["booking|b4"].idle, timeout=30)
    assert await registry.passivate_idle(older_than=0) == 1
