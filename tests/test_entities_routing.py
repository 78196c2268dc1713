"""Event routing that delivers: routed events reach the destination entities' event handlers
exactly once, in order per source, across restarts of the router and the destinations."""

from __future__ import annotations

from typing import Any

import pytest

from journal import ConfigurationError, EntityRegistry, EventRouter, Journal, routed_from
from journal.entities.router import ROUTER_TYPE
from tests.routing_fixtures import Account, LazyAccount, Order, SnapAccount
from tests.support.waiting import wait_until


async def routed_rows(journal: Journal, pid: str) -> list[tuple[str, int] | None]:
    return [routed_from(e) async for e in journal.current_events_by_persistence_id(pid)]


async def router_progress(dsn: str, router_id: str, *, forget: bool = False) -> int:
    """Slices with progress recorded by the routers ``router_id`` (``forget``: delete it first)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        name = f"{ROUTER_TYPE}|{router_id}|order"
        if forget:
            await conn.execute("DELETE FROM projection_timestamp_offset_store WHERE projection_name = $1", name)
        q = "SELECT count(DISTINCT slice) FROM projection_timestamp_offset_store WHERE projection_name = $1"
        return int(await conn.fetchval(q, name))
    finally:
        await conn.close()


def assert_once_in_order(rows: list[tuple[str, int] | None], expected: dict[str, list[int]]) -> None:
    got: dict[str, list[int]] = {}
    for r in rows:
        if r is not None:
            got.setdefault(r[0], []).append(r[1])
    assert got == expected


async def test_a_routed_event_reaches_the_destination_handler(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg:
        reg.register(Account)
        async with EventRouter(reg, ["order"]):
            w = await reg.ask_timed(Order, "o1", ("place", "pay 10", ["account|a", "account|b"]))
            assert w.reply == 1
            assert dict(w.vector_time) == {"order|o1": 1}
            for acc in ("a", "b"):
                state = await reg.ask(Account, acc, ("read",), after=w.vector_time, timeout=20)
                assert state == [["pay 10", ["order|o1", 1]]]
            # the destination's own commands go on after the routed copy
            assert await reg.ask(Account, "a", ("add", "own")) == 2
    assert await routed_rows(journal, "account|a") == [("order|o1", 1), None]
    src = [e async for e in journal.current_events_by_persistence_id("order|o1")]
    assert routed_from(src[0]) is None
    async with EntityRegistry(journal) as reg2:  # the destination's replay includes the copy
        assert await reg2.ask(Account, "a", ("read",)) == [["pay 10", ["order|o1", 1]], ["own", None]]


@pytest.mark.parametrize("dest_cls", [Account, SnapAccount, LazyAccount])
async def test_redelivery_after_router_and_destination_restarts_is_dropped(
    journal: Journal, dsn: str, dest_cls: type[Account]
) -> None:
    dest = f"{dest_cls.entity_type}|d"
    expected: dict[str, list[int]] = {}
    async with EntityRegistry(journal) as reg:
        reg.register(dest_cls)
        for i in range(6):
            src = f"o{i % 3}"
            n = await reg.ask(Order, src, ("place", f"e{i}", [dest]))
            expected.setdefault(f"order|{src}", []).append(n)
        async with EventRouter(reg, ["order"], router_id="r") as router:
            await wait_until(lambda: router.delivered == 6, what="first delivery")
        assert await router_progress(dsn, "r") == 1024  # one router: every slice, recorded on stop
        await reg.ask(dest_cls, "d", ("add", "own"))
        # the destination restarts (passivated), the router restarts from scratch (progress lost)
        assert await reg.passivate_idle(0) >= 1
        assert await router_progress(dsn, "r", forget=True) == 0
        for i in range(6, 9):
            n = await reg.ask(Order, "o0", ("place", f"e{i}", [dest]))
            expected["order|o0"].append(n)
        async with EventRouter(reg, ["order"], router_id="r") as again:
            await wait_until(lambda: again.delivered + again.duplicates == 9, what="re-delivery")
            assert (again.delivered, again.duplicates) == (3, 6)
        state = await reg.ask(dest_cls, "d", ("read",))
    assert_once_in_order(await routed_rows(journal, dest), expected)
    assert len(state) == 10 and ["own", None] in state


async def test_unregistered_destination_type_stops_the_router(journal: Journal) -> None:
    async with EntityRegistry(journal) as reg:
        await reg.ask(Order, "o1", ("place", "x", ["nosuchtype|z"]))
        router = EventRouter(reg, ["order"])
        await router.start()
        try:
            await wait_until(lambda: router.error is not None, what="the router to fail")
            assert isinstance(router.error, ConfigurationError)
        finally:
            await router.stop()


def test_bad_router_arguments() -> None:
    reg: Any = object.__new__(EntityRegistry)
    with pytest.raises(ValueError):
        EventRouter(reg, "order")
    with pytest.raises(ValueError):
        EventRouter(reg, [])


async def test_a_destination_recovered_from_a_snapshot_of_its_last_row_still_drops_redeliveries(
    journal: Journal, dsn: str
) -> None:
    async with EntityRegistry(journal) as reg:
        reg.register(SnapAccount)
        for i in range(3):
            await reg.ask(Order, "o1", ("place", f"e{i}", ["snapaccount|s"]))
        async with EventRouter(reg, ["order"], router_id="r") as router:
            await wait_until(lambda: router.delivered == 3, what="delivery")
        await reg.passivate_idle(0)
        snap = await journal.load_snapshot("snapaccount|s")
        assert snap is not None and snap.seq_nr == 3  # nothing left to replay after it
        await router_progress(dsn, "r", forget=True)
        async with EventRouter(reg, ["order"], router_id="r") as again:
            await wait_until(lambda: again.duplicates == 3, what="re-delivery dropped")
            assert again.delivered == 0
        assert len(await reg.ask(SnapAccount, "s", ("read",))) == 3
    assert_once_in_order(await routed_rows(journal, "snapaccount|s"), {"order|o1": [1, 2, 3]})


def test_progress_commits_an_offset_only_when_everything_before_it_is_written() -> None:
    from datetime import UTC, datetime, timedelta

    from journal import TimestampOffset
    from journal.entities.slice_job import Progress

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    offs = [TimestampOffset(t0 + timedelta(seconds=i)) for i in range(4)]
    p = Progress()
    order, other = ("order", 0, 1023), ("other", 0, 1023)
    a = p.read(order, offs[0])
    a.add(2)  # two destinations
    b = p.read(order, offs[1])
    b.add()
    c = p.read(order, offs[2])  # nothing to route
    d = p.read(other, offs[3])
    d.add()
    for r in (a, b, c, d):
        p.complete(r)  # the handler returned
    assert p.offsets == {} and p.open == 4
    p.complete(b)  # b is done, a is not: nothing moves
    p.complete(a)
    assert p.offsets == {}
    p.complete(a)  # a done: a, b and the unrouted event commit together
    assert p.offsets == {order: offs[2]} and p.dirty == {order}
    p.complete(d)
    assert p.offsets == {order: offs[2], other: offs[3]} and p.open == 0
    p.drop(order)  # a stream that stops no longer counts
    assert p.offsets == {other: offs[3]}


async def test_a_routed_copy_whose_write_was_interrupted_but_committed_is_not_written_twice(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The write commits but the answer is lost: the cell resolves the outcome from the database,
    and the copy's source mark must come out of that too, or a re-delivery writes it again."""
    from journal import JournalUnavailable
    from journal.entities.delivery import RoutedEvent

    real_persist = journal.persist
    lost: list[str] = []

    async def answer_lost(pid: str, events: Any, **kw: Any) -> Any:
        envs = await real_persist(pid, events, **kw)  # really written
        if pid == "account|r" and not lost:
            lost.append(pid)
            raise JournalUnavailable("connection lost after the commit", outcome_unknown=True)
        return envs

    monkeypatch.setattr(journal, "persist", answer_lost)
    async with EntityRegistry(journal) as reg:
        reg.register(Account)
        copy = [RoutedEvent("order|o1", 1, "pay")]
        assert await reg.deliver_routed("account|r", copy) == 1
        assert lost == ["account|r"]
        assert await reg.deliver_routed("account|r", copy) == 0  # the same live entity drops it
        assert await reg.ask(Account, "r", ("read",)) == [["pay", ["order|o1", 1]]]
    assert await routed_rows(journal, "account|r") == [("order|o1", 1)]
