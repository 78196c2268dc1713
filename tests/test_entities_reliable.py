"""persist_on_event and confirmed delivery, in one process (the process-kill tests are in
test_entities_reliable_processes.py)."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from journal import EntityRegistry, InvalidArgument, Journal, PersistNotAllowed, after_persist
from journal.entities import Delivery, Entity
from tests.reliable_fixtures import Order, Sender
from tests.support.waiting import wait_until


async def events_of(journal: Journal, pid: str) -> list[Any]:
    return [e async for e in journal.current_events_by_persistence_id(pid)]


async def test_follow_ups_are_written_once_and_marked(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg:
        assert await reg.ask(Order, "o1", ("place", "x")) == ["placed:x"]
        state = await wait_until(lambda: _len_is(reg.ask(Order, "o1", ("read",)), 3), what="the follow-up chain")
        assert state == ["placed:x", "reserved:x", "shipped:x"]
    envs = await events_of(journal, "order|o1")
    assert [e.event for e in envs] == ["placed:x", "reserved:x", "shipped:x"]
    assert envs[1].metadata == {"on_event_of": {"2": 1}}
    assert envs[2].metadata == {"on_event_of": {"3": 2}, "destinations": {"3": ["shipping|1"]}}
    async with EntityRegistry(journal) as reg:  # replay asks again: nothing written
        assert await reg.ask(Order, "o1", ("read",)) == ["placed:x", "reserved:x", "shipped:x"]
        assert await reg.ask(Order, "o1", ("place", "y")) == ["placed:x", "reserved:x", "shipped:x", "placed:y"]
        await wait_until(lambda: _len_is(reg.ask(Order, "o1", ("read",)), 6), what="y's follow-ups")
    assert [e.event for e in await events_of(journal, "order|o1")] == [
        "placed:x", "reserved:x", "shipped:x", "placed:y", "reserved:y", "shipped:y",
    ]  # fmt: skip


async def _len_is(reply: Any, n: int) -> Any:
    state = await reply
    return state if len(state) == n else None


async def test_missing_follow_up_is_written_by_recovery(journal: Journal) -> None:
    await journal.persist("order|o2", ["placed:z"])  # as if the process died right after it
    async with EntityRegistry(journal) as reg:
        await reg.start(Order, "o2")
        await wait_until(lambda: _len_is(reg.ask(Order, "o2", ("read",)), 3), what="recovered follow-ups")
    async with EntityRegistry(journal) as reg:
        assert await reg.ask(Order, "o2", ("read",)) == ["placed:z", "reserved:z", "shipped:z"]
    assert len(await events_of(journal, "order|o2")) == 3


class Lazy(Order):
    entity_type = "lazyorder"
    state_sync = False


async def test_follow_ups_with_state_sync_false(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg:
        for i in range(5):
            await reg.ask(Lazy, "l", ("place", str(i)))
        await wait_until(lambda: _len_is(reg.ask(Lazy, "l", ("read",)), 15), what="15 events")
    events = [e.event for e in await events_of(journal, "lazyorder|l")]
    for i in range(5):
        assert events.count(f"reserved:{i}") == 1 and events.count(f"shipped:{i}") == 1
        assert events.index(f"placed:{i}") < events.index(f"reserved:{i}") < events.index(f"shipped:{i}")


class Misuse(Entity[list[Any]]):
    entity_type = "misuse"

    def initial_state(self) -> list[Any]:
        return []

    def on_command(self, command: Any) -> Any:
        if command == "poe":
            self.persist_on_event("x")
        if command == "deliver":
            self.deliver("d", "m", "sink")
        if command == "bad_confirmation":
            self.persist_confirmation("c", "")
        if command == "bad_deliver":
            self.persist("bad")
            return after_persist(lambda: None)
        return None

    def on_event(self, state: list[Any], event: Any) -> list[Any]:
        if event == "bad":
            self.deliver("", "m", "sink")
        return [*state, event]


async def test_misuse_is_refused(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg:
        with pytest.raises(PersistNotAllowed, match="only allowed inside its on_event"):
            await reg.ask(Misuse, "m", "poe")
        with pytest.raises(PersistNotAllowed):
            await reg.ask(Misuse, "m", "deliver")
        with pytest.raises(InvalidArgument):
            await reg.ask(Misuse, "m", "bad_confirmation")
        with pytest.raises(InvalidArgument):
            reg.add_destination("", lambda d: None)
        with pytest.raises(InvalidArgument):
            reg.add_destination("x", "not callable")  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="no registered entity type"):
            await reg.ask_pid("nobody|1", "x")
    assert await events_of(journal, "misuse|m") == []


async def test_redelivered_at_the_interval_until_confirmed_once(journal: Journal) -> None:
    attempts: list[tuple[float, Delivery]] = []
    async with EntityRegistry(journal) as reg:

        async def sink(d: Delivery) -> None:
            attempts.append((time.monotonic(), d))
            if len(attempts) == 3:  # the third attempt confirms
                await reg.ask_pid(d.sender, ("confirm", d.delivery_id))

        reg.add_destination("sink", sink)
        await reg.ask(Sender, "s1", ("send", "hello"))
        await wait_until(lambda: _empty(reg.ask(Sender, "s1", ("unconfirmed",))), what="the confirmation")
        assert await reg.ask(Sender, "s1", ("confirm", "d-1")) is None  # late: writes nothing
    assert [(d.delivery_id, d.sender, d.message, d.attempt) for _, d in attempts] == [
        ("d-1", "sender|s1", "hello", 1), ("d-1", "sender|s1", "hello", 2), ("d-1", "sender|s1", "hello", 3),
    ]  # fmt: skip
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(attempts)]
    assert all(g >= Sender.redeliver_interval * 0.95 for g in gaps), gaps
    envs = await events_of(journal, "sender|s1")
    assert [e.event for e in envs] == ["send:hello", "confirmed:d-1"]
    assert envs[1].metadata == {"confirms": {"2": "d-1"}}


async def _empty(reply: Any) -> bool:
    return not await reply


async def test_failing_destination_is_retried(journal: Journal) -> None:
    calls: list[int] = []
    async with EntityRegistry(journal) as reg:

        def sink(d: Delivery) -> None:
            calls.append(d.attempt)
            if d.attempt < 2:
                raise ConnectionError("destination down")

        reg.add_destination("sink", sink)
        await reg.ask(Sender, "s2", ("send", "m"))
        await wait_until(lambda: len(calls) >= 2, what="a second attempt after a failure")
    assert calls[:2] == [1, 2]


async def test_unconfirmed_deliveries_survive_a_snapshot(journal: Journal) -> None:
    seen: list[Delivery] = []
    async with EntityRegistry(journal) as reg:
        reg.add_destination("sink", seen.append)
        await reg.ask(Sender, "s3", ("send", "kept"))
        await reg.ask(Sender, "s3", ("snapshot",))
        await wait_until(lambda: seen, what="the first delivery")
    snap = await journal.load_snapshot("sender|s3")
    assert snap is not None and snap.seq_nr == 1
    assert snap.metadata["entity"]["unconfirmed"][0][:2] == ["d-1", "sink"]
    seen.clear()
    async with EntityRegistry(journal) as reg:  # recovers from the snapshot: no event replayed
        reg.add_destination("sink", seen.append)
        await reg.start(Sender, "s3")
        await wait_until(lambda: seen, what="the delivery after restart")
        assert seen[0].message == "kept" and seen[0].attempt == 1
        assert await reg.ask(Sender, "s3", ("unconfirmed",)) == ["d-1"]
        await reg.ask(Sender, "s3", ("confirm", "d-1"))
        assert await reg.ask(Sender, "s3", ("unconfirmed",)) == []


async def test_an_entity_with_unconfirmed_deliveries_is_not_passivated(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg:
        reg.add_destination("sink", lambda d: None)
        await reg.ask(Sender, "s4", ("send", "m"))
        assert await reg.passivate_idle(older_than=0) == 0
        await reg.ask(Sender, "s4", ("confirm", "d-1"))
        assert await reg.passivate_idle(older_than=0) == 1


def test_bookkeeping_survives_snapshot_metadata() -> None:
    from journal.entities.reliable import Bookkeeping, FollowUp
    from journal.serialization import SerializerRegistry

    serializers = SerializerRegistry()
    book = Bookkeeping()
    book.add_follow_up(FollowUp(3, {"reserved": "x"}, ("shipping|1",)))
    book.add_delivery("d-1", "sink", ["m", 1], live=True)
    book.take_follow_ups()  # in flight when the snapshot is taken: still saved
    meta = book.to_metadata(serializers, "order|1")
    assert meta is not None
    again = Bookkeeping()
    again.load_metadata(meta, serializers, "order|1")
    assert again.take_follow_ups() == [FollowUp(3, {"reserved": "x"}, ("shipping|1",))]
    assert {d: (u.destination, u.message) for d, u in again.unconfirmed.items()} == {"d-1": ("sink", ["m", 1])}
    assert again.fresh == []  # delivered by recovery, not as fresh
    assert Bookkeeping().to_metadata(serializers, "order|1") is None
    again.load_metadata({"other": 1}, serializers, "order|1")
    assert not again.follow_ups and not again.unconfirmed


class Reserving(Entity[list[str]]):
    """``("place", x)`` writes ``placed x``, whose handler asks for ``reserved x``; ``("other",
    y)`` writes ``other y``."""

    entity_type = "reserving"

    def initial_state(self) -> list[str]:
        return []

    def on_command(self, command: Any) -> Any:
        self.persist(f"{command[0]} {command[1]}")
        return after_persist(lambda: list(self.state))

    def on_event(self, state: list[str], event: str) -> list[str]:
        if event.startswith("placed "):
            self.persist_on_event(event.replace("placed", "reserved"))
        return [*state, event]


async def test_a_failed_follow_up_write_restarts_the_entity_before_its_next_command(journal: Journal, dsn: str) -> None:
    """The database refuses the follow-up's write once; a command queued behind the trigger must
    run only after the restarted entity wrote the follow-up (not between the two)."""
    import asyncio

    from tests.support.refusals import refusing

    async with refusing(dsn, "reserving|r1", "reserved") as conn, EntityRegistry(journal) as reg:
        placed = asyncio.ensure_future(reg.ask(Reserving, "r1", ("placed", "1")))
        other = asyncio.ensure_future(reg.ask(Reserving, "r1", ("other", "2")))  # queued behind it
        assert await placed == ["placed 1"]
        assert await other == ["placed 1", "reserved 1", "other 2"]
        assert await conn.fetchval("SELECT last_value FROM sj_test_refusals") == 2  # refused once, then written
    assert [e.event for e in await events_of(journal, "reserving|r1")] == ["placed 1", "reserved 1", "other 2"]
