"""Behaviour changes, stashing, timed replies and redelivery, as Eventuate has them (real PostgreSQL;
the database refuses a chosen write with a real trigger, tests/support/refusals.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from journal import (
    Entity,
    EntityRegistry,
    EventRouter,
    Journal,
    JournalError,
    StashTimeout,
    after_persist,
)
from journal.entities import Delivery
from tests.routing_fixtures import Account
from tests.support.refusals import refusing
from tests.support.waiting import wait_until


class Door(Entity[list[str]]):
    """``lock x`` locks (commands but ``unlock`` wait stashed), ``unlock x`` opens again; both
    change behaviour in the command handler. ``shut x`` locks from the persist handler instead."""

    entity_type = "door"
    stash_timeout = 0  # none: these tests wait on purpose

    def initial_state(self) -> list[str]:
        return []

    def on_command(self, command: Any) -> Any:
        kind, arg = command
        if kind == "lock":
            self.persist(f"locked {arg}")
            self.become(self.locked)
            return after_persist(lambda: list(self.state))
        if kind == "shut":
            self.persist(f"locked {arg}")
            return after_persist(lambda: (self.become(self.locked), list(self.state))[1])
        return ("open", list(self.state))

    def locked(self, command: Any) -> Any:
        kind, arg = command
        if kind == "unlock":
            self.persist(f"unlocked {arg}")
            self.unbecome()
            self.unstash_all()
            return after_persist(lambda: list(self.state))
        if kind == "open_later":  # unbecome and unstash in the persist handler, Eventuate's way

            def opened(_env: Any) -> None:
                self.unbecome()
                self.unstash_all()

            self.persist(f"unlocked {arg}", on_persisted=opened)
            return None
        self.stash()
        return None

    def on_recovery(self, error: Exception | None) -> None:
        if error is None and self.state and self.state[-1].startswith("locked"):
            self.become(self.locked)  # the behaviour restored from the recovered state

    def on_event(self, state: list[str], event: str) -> list[str]:
        return [*state, event]


async def test_a_failed_write_undoes_its_commands_become(journal: Journal, dsn: str) -> None:
    async with refusing(dsn, "door|d1", "locked fail"), EntityRegistry(journal) as reg:
        with pytest.raises(JournalError):
            await reg.ask(Door, "d1", ("lock", "fail"))
        # not locked: a read is answered at once, not stashed
        assert await asyncio.wait_for(reg.ask(Door, "d1", ("read", "")), 10) == ("open", [])
        assert await reg.ask(Door, "d1", ("lock", "ok")) == ["locked ok"]  # and it locks when written
        read = asyncio.ensure_future(reg.ask(Door, "d1", ("read", "")))
        await wait_until(lambda: stashed(reg, "door|d1") == 1, 10, "the read to be stashed")
        await reg.ask(Door, "d1", ("unlock", "ok"))
        assert await asyncio.wait_for(read, 10) == ("open", ["locked ok", "unlocked ok"])


def stashed(reg: EntityRegistry, pid: str) -> int:
    cell = reg._cells.get(pid)  # (what the stash tests look at)
    return 0 if cell is None else len(cell._stash)


async def test_a_failed_write_undoes_its_commands_unbecome_and_unstash(journal: Journal, dsn: str) -> None:
    async with refusing(dsn, "door|d2", "unlocked fail"), EntityRegistry(journal) as reg:
        await reg.ask(Door, "d2", ("lock", "1"))
        read = asyncio.ensure_future(reg.ask(Door, "d2", ("read", "")))
        await wait_until(lambda: stashed(reg, "door|d2") == 1, 10, "the read to be stashed")
        with pytest.raises(JournalError):
            await reg.ask(Door, "d2", ("unlock", "fail"))
        assert stashed(reg, "door|d2") == 1 and not read.done(), "still locked: the read stays stashed"
        second = asyncio.ensure_future(reg.ask(Door, "d2", ("read", "")))
        await wait_until(lambda: stashed(reg, "door|d2") == 2, 10, "the second read to be stashed")
        await reg.ask(Door, "d2", ("unlock", "2"))
        assert await asyncio.wait_for(read, 10) == ("open", ["locked 1", "unlocked 2"])
        assert await asyncio.wait_for(second, 10) == ("open", ["locked 1", "unlocked 2"])


async def test_become_and_unstash_in_the_persist_handler_and_on_recovery(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg:
        assert await reg.ask(Door, "d3", ("shut", "1")) == ["locked 1"]  # became locked in after_persist
        read = asyncio.ensure_future(reg.ask(Door, "d3", ("read", "")))
        await wait_until(lambda: stashed(reg, "door|d3") == 1, 10, "the read to be stashed")
        await reg.ask(Door, "d3", ("open_later", "1"))  # unbecome + unstash_all in on_persisted
        assert await asyncio.wait_for(read, 10) == ("open", ["locked 1", "unlocked 1"])
        await reg.ask(Door, "d3", ("lock", "2"))
    async with EntityRegistry(journal) as reg:  # recovered: on_recovery restores "locked"
        read = asyncio.ensure_future(reg.ask(Door, "d3", ("read", "")))
        await wait_until(lambda: stashed(reg, "door|d3") == 1, 10, "the read to be stashed")
        await reg.ask(Door, "d3", ("unlock", "2"))
        assert (await asyncio.wait_for(read, 10))[0] == "open"


class Impatient(Door):
    entity_type = "impatientdoor"
    stash_timeout = 0.3


async def test_a_stashed_command_times_out(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg:
        await reg.ask(Impatient, "i", ("lock", "1"))
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(StashTimeout):
            await asyncio.wait_for(reg.ask(Impatient, "i", ("read", "")), 10)
        assert asyncio.get_running_loop().time() - t0 < 5
        assert await reg.ask(Impatient, "i", ("unlock", "1")) == ["locked 1", "unlocked 1"]


class Shop(Entity[dict[str, int]]):
    """``place o`` once per order id: a retry writes nothing and replies as of the first write.
    Orders are routed to ``account|books``; ``note`` writes an event routed nowhere."""

    entity_type = "shop"

    def initial_state(self) -> dict[str, int]:
        return {}

    def on_command(self, command: Any) -> Any:
        kind, arg = command
        if kind == "note":
            self.persist({"note": arg})
            return None
        if arg in self.state:
            self.reply_as_of(self.state[arg])  # a deduplicated retry: the time of the first write
            return "placed before"
        self.persist({"order": arg}, destinations=["account|books"])
        return "placed"

    def on_event(self, state: dict[str, int], event: dict[str, str]) -> dict[str, int]:
        if "order" in event:
            return {**state, event["order"]: self.current_event.seq_nr}
        return state


async def test_a_timed_retry_replies_with_its_writes_vector_time(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg:
        reg.register(Account)
        async with EventRouter(reg, ["shop"]):
            first = await reg.ask_timed(Shop, "s", ("place", "o1"))
            await reg.ask(Shop, "s", ("note", "not routed"))  # the shop moves on: seq_nr 2
            retry = await reg.ask_timed(Shop, "s", ("place", "o1"))
            assert (first.reply, retry.reply) == ("placed", "placed before")
            assert dict(retry.vector_time) == dict(first.vector_time) == {"shop|s": 1}
            # the routed destination reaches the retry's time (it never sees shop|s 2)
            state = await reg.ask(Account, "books", ("read",), after=retry.vector_time, timeout=10)
            assert state == [[{"order": "o1"}, ["shop|s", 1]]]


class Sender(Entity[list[str]]):
    entity_type = "nudgedsender"
    redeliver_interval = 3600.0  # only redeliver_unconfirmed sends again

    def initial_state(self) -> list[str]:
        return []

    def on_command(self, command: Any) -> Any:
        if command == "send":
            self.persist("send")
        elif command == "nudge":
            self.redeliver_unconfirmed()
        return None

    def on_event(self, state: list[str], event: str) -> list[str]:
        self.deliver(f"d{self.current_event.seq_nr}", event, "sink")
        return [*state, event]


async def test_redeliver_unconfirmed_sends_every_open_delivery_now(journal: Journal) -> None:
    got: list[Delivery] = []
    async with EntityRegistry(journal) as reg:
        reg.add_destination("sink", got.append)
        await reg.ask(Sender, "n", "send")
        await wait_until(lambda: len(got) == 1, 10, "the first attempt")
        await reg.ask(Sender, "n", "nudge")
        await wait_until(lambda: len(got) == 2, 10, "the nudged attempt")
    assert [(d.delivery_id, d.attempt) for d in got] == [("d1", 1), ("d1", 2)]
