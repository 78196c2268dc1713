"""Entities on both backends (a real PostgreSQL and a real Cassandra): ordering, atomicity, stateSync,
recovery, snapshots, routing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from cassandra_fixtures import open_test_journal

from journal import (
    EntityRegistry,
    Journal,
    PersistNotAllowed,
    RecoveryFailed,
    SequenceConflict,
    SerializationError,
    destinations_of,
    routed_to,
)
from journal.envelope import ROW_STEP
from journal.settings import EntitySettings
from tests.entity_fixtures import Counter, LazyCounter, SkipCounter, SnapCounter
from tests.support.waiting import wait_until


@pytest.fixture
async def journal(journal_target: str) -> AsyncIterator[Journal]:
    """This module's journal: every test runs on PostgreSQL and on Cassandra."""
    async with open_test_journal(journal_target) as j:
        yield j


@pytest.fixture
def persist_calls(journal: Journal) -> list[tuple[str, int]]:
    """(pid, number of events) of every ``persist`` call on the journal: how many writes there
    were, on either backend (on Cassandra each event has its own TimeUUID, hence its own time)."""
    calls: list[tuple[str, int]] = []
    inner = journal.persist

    async def persist(pid: str, events: Any, **kw: Any) -> Any:
        calls.append((pid, len(events)))
        return await inner(pid, events, **kw)

    journal.persist = persist  # type: ignore[method-assign]
    return calls


@pytest.fixture
async def registry(journal: Journal) -> AsyncIterator[EntityRegistry]:
    Counter.log = []
    async with EntityRegistry(journal) as reg:
        yield reg


async def stored(journal: Journal, pid: str) -> list[object]:
    return [e.event async for e in journal.current_events_by_persistence_id(pid)]


async def test_event_handler_runs_before_callback_and_reply(registry: EntityRegistry, journal: Journal) -> None:
    reply = await registry.ask(Counter, "a", ("add", "x"))
    assert reply == ["x"]  # after_persist sees the applied event
    assert Counter.log == ["event x", "cb 1"]
    assert await stored(journal, "counter|a") == ["x"]


async def test_persist_all_is_atomic_and_ordered(
    registry: EntityRegistry, journal: Journal, persist_calls: list[tuple[str, int]]
) -> None:
    assert await registry.ask(Counter, "a", ("add_all", ["1", "2", "3"])) == 3
    envs = [e async for e in journal.current_events_by_persistence_id("counter|a")]
    assert [(e.seq_nr, e.event) for e in envs] == [(1, "1"), (2, "2"), (3, "3")]
    assert persist_calls == [("counter|a", 3)]  # one write
    if journal.backend.name == "postgres":
        first = envs[0].db_timestamp  # one statement: consecutive microseconds
        assert [e.db_timestamp for e in envs] == [first, first + ROW_STEP, first + 2 * ROW_STEP]
    # an unserializable event in the batch: nothing of it is written, state unchanged
    with pytest.raises(SerializationError):
        await registry.ask(Counter, "a", ("unserializable",))
    assert await registry.ask(Counter, "a", ("read",)) == ["1", "2", "3"]
    assert await journal.highest_seq_nr("counter|a") == 3


async def test_failing_command_writes_nothing(registry: EntityRegistry, journal: Journal) -> None:
    await registry.ask(Counter, "a", ("add", "x"))
    with pytest.raises(ValueError, match="refused"):
        await registry.ask(Counter, "a", ("fail",))
    assert await registry.ask(Counter, "a", ("read",)) == ["x"]
    assert await stored(journal, "counter|a") == ["x"]


async def test_persist_outside_a_command_is_refused(registry: EntityRegistry) -> None:
    c = Counter("z")
    with pytest.raises(PersistNotAllowed, match=r"counter\|z"):
        c.persist("x")
    with pytest.raises(PersistNotAllowed):
        c.save_snapshot()
    # from an event handler: the stored event fails to apply, the command gets the error
    with pytest.raises(PersistNotAllowed):
        await registry.ask(Counter, "b", ("add", "persist_in_handler"))


async def test_state_sync_true_commands_see_current_state(registry: EntityRegistry) -> None:
    replies = await asyncio.gather(*(registry.ask(Counter, "s", ("seen_then_add", i)) for i in range(20)))
    assert replies == list(range(20))  # every command saw all earlier events


async def test_state_sync_false_batches_writes_of_one_entity(
    registry: EntityRegistry, journal: Journal, persist_calls: list[tuple[str, int]]
) -> None:
    replies = await asyncio.gather(*(registry.ask(LazyCounter, "s", ("seen_then_add", i)) for i in range(50)))
    assert replies.count(0) >= 2  # commands ran while the first write was in flight
    envs = [e async for e in journal.current_events_by_persistence_id("lazy|s")]
    assert [e.event for e in envs] == list(range(50))  # order of arrival kept
    assert sum(n for _, n in persist_calls) == 50
    assert len(persist_calls) < 50  # several commands shared one persist call
    assert await registry.ask(LazyCounter, "s", ("read",)) == list(range(50))


async def test_recovery_replays_in_batches(journal: Journal) -> None:
    await journal.persist("counter|r", [f"e{i}" for i in range(25)])
    settings = EntitySettings(replay_batch_size=4)
    async with EntityRegistry(journal, settings) as reg:
        assert await reg.ask(Counter, "r", ("read",)) == [f"e{i}" for i in range(25)]
        assert await reg.ask(Counter, "r", ("add", "new")) == [*(f"e{i}" for i in range(25)), "new"]
    assert await journal.highest_seq_nr("counter|r") == 26


async def test_commands_wait_for_recovery_and_failure_is_reported(journal: Journal) -> None:
    await journal.persist("counter|p", ["ok", "poison", "later"])
    async with EntityRegistry(journal) as reg:
        results = await asyncio.gather(*(reg.ask(Counter, "p", ("read",)) for _ in range(3)), return_exceptions=True)
        assert all(isinstance(r, RecoveryFailed) for r in results)
        err = results[0]
        assert isinstance(err, RecoveryFailed)
        assert (err.persistence_id, err.seq_nr) == ("counter|p", 2)
        assert "counter|p" in str(err) and "seq_nr 2" in str(err)
        await wait_until(lambda: not reg.is_active(Counter, "p"), 10, "the entity passivated")  # not used afterwards
        assert await journal.highest_seq_nr("counter|p") == 3  # nothing written


async def test_snapshots_every_n_and_on_request(registry: EntityRegistry, journal: Journal) -> None:
    for i in range(7):
        await registry.ask(SnapCounter, "a", ("add", i))

    async def snapshot_at_6() -> Any:
        snap = await journal.load_snapshot("snap|a")
        return snap if snap is not None and snap.seq_nr >= 6 else None

    snap = await wait_until(snapshot_at_6, 5, "the automatic snapshot at seq_nr 6")
    assert snap.seq_nr == 6 and snap.state == [0, 1, 2, 3, 4, 5]
    await registry.ask(Counter, "b", ("snapshot", "x"))
    snap2 = await wait_until(lambda: journal.load_snapshot("counter|b"), 5, "the requested snapshot")
    assert (snap2.seq_nr, snap2.state) == (1, ["x"])


async def test_recovery_uses_snapshot_then_later_events(journal: Journal) -> None:
    Counter.log = []
    await journal.persist("snap|b", ["a", "b", "c", "d"])
    await journal.save_snapshot("snap|b", 3, ["A", "B", "C"])  # differs from events: proves use
    async with EntityRegistry(journal) as reg:
        assert await reg.ask(SnapCounter, "b", ("read",)) == ["A", "B", "C", "d"]
    assert Counter.log == ["event d"]  # only the later event was replayed


async def test_snapshot_that_does_not_load_falls_back_to_full_replay(journal: Journal) -> None:
    await journal.persist("snap|c", ["a", "b"])
    await journal.save_snapshot("snap|c", 2, ["bad"])
    async with EntityRegistry(journal) as reg:
        assert await reg.ask(SnapCounter, "c", ("read",)) == ["a", "b"]


async def test_replay_from_seq_nr_skips_history(journal: Journal) -> None:
    await journal.persist("skip|a", ["1", "2", "3", "4"])
    async with EntityRegistry(journal) as reg:
        assert await reg.ask(SkipCounter, "a", ("read",)) == ["3", "4"]
        await reg.ask(SkipCounter, "a", ("add", "5"))
    assert await journal.highest_seq_nr("skip|a") == 5


async def test_passivation_and_reactivation(journal: Journal) -> None:
    settings = EntitySettings(passivate_after=0.2)
    async with EntityRegistry(journal, settings) as reg:
        await reg.ask(Counter, "p", ("add", "x"))
        assert reg.is_active(Counter, "p")
        await wait_until(lambda: not reg.is_active(Counter, "p"), 10, "the entity passivated")
        assert reg.passivations >= 1
        assert await reg.ask(Counter, "p", ("add", "y")) == ["x", "y"]  # recovered on demand
        assert reg.is_active(Counter, "p")


async def test_one_instance_per_pid(registry: EntityRegistry) -> None:
    await asyncio.gather(*(registry.ask(Counter, "one", ("add", i)) for i in range(10)))
    assert registry.active_count == 1
    assert sorted(await registry.ask(Counter, "one", ("read",))) == list(range(10))


async def test_routing_is_stored_with_the_event(registry: EntityRegistry, journal: Journal) -> None:
    await registry.ask(Counter, "r", ("add", "plain"))
    await registry.ask(Counter, "r", ("route", "moved", ["account|b", "account|c"]))
    envs = [e async for e in journal.current_events_by_persistence_id("counter|r")]
    assert destinations_of(envs[0]) == ()
    assert destinations_of(envs[1]) == ("account|b", "account|c")
    assert routed_to(envs[1], "account|c") and routed_to(envs[1], "counter|r")
    assert not routed_to(envs[0], "account|b")


async def test_concurrent_conflict_from_another_writer_restarts(registry: EntityRegistry, journal: Journal) -> None:
    await registry.ask(Counter, "c", ("add", "mine"))
    await journal.persist("counter|c", ["theirs"])  # someone else wrote the pid
    with pytest.raises(SequenceConflict):
        await registry.ask(Counter, "c", ("add", "lost"))
    # restarted from the journal: sees the other writer's event, writes after it
    assert await registry.ask(Counter, "c", ("add", "again")) == ["mine", "theirs", "again"]
