"""Endpoints in this process: availability subscriptions and the application version check."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from endpoint_processes import free_address
from replication_helpers import location_databases

from journal.errors import ConfigurationError
from journal.replication.availability import Available, FailureDetector, Unavailable
from journal.replication.config import EndpointConfig
from journal.replication.endpoint import ReplicationEndpoint
from journal.replication.versions import Application
from tests.support.waiting import wait_until

LOG = "Item"


@pytest.fixture(scope="module")
def dbs(server_dsn: str) -> Iterator[dict[str, str]]:
    with location_databases(server_dsn, ["A", "B", "C"]) as d:
        yield d


def test_failure_detector_publishes_after_the_limit() -> None:
    d = FailureDetector("x:1", LOG, limit=5.0, now=100.0)
    assert d.check(102.0) is None  # not a full limit yet
    d.failure(ConnectionError("refused"))
    assert d.check(105.0) == Unavailable("x:1", LOG, ("ConnectionError: refused",))
    d.success(106.0)
    assert d.check(110.0) == Available("x:1", LOG)
    assert d.check(111.5) == Unavailable("x:1", LOG, ("no reply",))


def test_config_is_validated() -> None:
    base = {"location": "A", "dsn": "postgresql://x/y", "listen": "127.0.0.1:1", "logs": [LOG]}
    assert EndpointConfig.from_dict(base).logs == (LOG,)
    for bad in (
        {**base, "location": "a b"},
        {**base, "listen": "nowhere"},
        {**base, "logs": []},
        {**base, "logs": ["a|b"]},
        {**base, "connections": [{"address": "127.0.0.1:2", "logs": ["Other"]}]},
        {**base, "retry_delay": 0},
        {**base, "surprise": 1},
        {**base, "application": {"name": "x", "version": "one"}},
    ):
        with pytest.raises(ConfigurationError):
            EndpointConfig.from_dict(bad)


async def test_availability_is_published_and_an_older_version_is_unavailable(dbs: dict[str, str]) -> None:
    addresses = {n: free_address() for n in "ABC"}

    def config(n: str, version: str, pulls: list[str]) -> EndpointConfig:
        return EndpointConfig.from_dict(
            {
                "location": n, "dsn": dbs[n], "listen": addresses[n], "logs": [LOG],
                "connections": [{"address": addresses[m]} for m in pulls],
                "application": {"name": "shop", "version": version},
                "retry_delay": 0.2, "failure_detection_limit": 1.0,
            }
        )  # fmt: skip

    async with contextlib.AsyncExitStack() as stack:
        a = await stack.enter_async_context(ReplicationEndpoint(config("A", "1.3", [])))
        b = ReplicationEndpoint(config("B", "1.2", ["A"]))  # older than its source: refused
        c = ReplicationEndpoint(config("C", "1.3.1", ["A"]))
        qb, qc = b.subscribe(), c.subscribe()
        await stack.enter_async_context(b)
        await stack.enter_async_context(c)
        await a.journal.persist(f"{LOG}|1", [{"v": 1}])
        got_b = await asyncio.wait_for(qb.get(), 30)
        got_c = await asyncio.wait_for(qc.get(), 30)
        assert isinstance(got_b, Unavailable) and got_b.endpoint == addresses["A"]
        assert any("older" in cause for cause in got_b.causes)
        assert got_c == Available(addresses["A"], LOG)
        await wait_count(c.store, 1)
        assert await b.store.event_ids(LOG) == {}
        assert Application("shop", "1.3").parts == (1, 3)


async def wait_count(store: Any, n: int) -> None:
    async def stored() -> bool:
        return len(await store.event_ids(LOG)) == n

    await wait_until(stored, 60, f"{n} events stored", every=0.05)


async def test_disaster_recovery_rebuilds_a_wiped_location(dbs: dict[str, str]) -> None:
    from conftest import truncate_all

    from journal.postgres.backend import PostgresBackend

    for db in dbs.values():
        await truncate_all(db)
    addresses = {n: free_address() for n in "AB"}

    def config(n: str, pulls: list[str]) -> EndpointConfig:
        return EndpointConfig.from_dict(
            {"location": n, "dsn": dbs[n], "listen": addresses[n], "logs": [LOG],
             "connections": [{"address": addresses[m]} for m in pulls], "retry_delay": 0.2}
        )  # fmt: skip

    async with ReplicationEndpoint(config("B", ["A"])) as b:
        async with ReplicationEndpoint(config("A", ["B"])) as a:
            for i in range(5):
                await a.journal.persist(f"{LOG}|a{i}", [{"v": i}, {"v": i + 10}])
            await b.journal.persist(f"{LOG}|b", [{"v": "b"}])
            await wait_count(a.store, 11)
            await wait_count(b.store, 11)
        # the disaster: A's database is lost (a snapshot survives, covering events A no longer has)
        await truncate_all(dbs["A"])
        async with ReplicationEndpoint(config("A", ["B"]), recover=True) as a:  # nothing pulls before recover()
            await a.journal.save_snapshot(f"{LOG}|a0", 2, {"state": "old"})
            assert a.recovering and await a.store.event_ids(LOG) == {}
            assert await a.recover() == {LOG: 11}  # every event counted: the pulls waited for it
            assert len(await a.store.event_ids(LOG)) == 11  # caught up when recover() returns
            assert await a.journal.load_snapshot(f"{LOG}|a0") is not None  # a0 has 2 events again: valid
            await a.journal.save_snapshot(f"{LOG}|a1", 9, {"state": "covers lost events"})
            await a.recover()
            assert await a.journal.load_snapshot(f"{LOG}|a1") is None
            await a.journal.persist(f"{LOG}|new", [{"v": "after recovery"}])
            await wait_count(b.store, 12)  # B does not skip it, although it read A's old log that far
            await wait_count(a.store, 12)
            for store in (a.store, b.store):
                assert set((await store.event_ids(LOG)).values()) == {1}
            assert isinstance(a.journal.backend, PostgresBackend)


async def test_deletion_is_logical_first_and_physical_once_replicated(dbs: dict[str, str]) -> None:
    from conftest import truncate_all

    for db in dbs.values():
        await truncate_all(db)
    addresses = {n: free_address() for n in "AB"}
    a_cfg = EndpointConfig.from_dict(
        {"location": "A", "dsn": dbs["A"], "listen": addresses["A"], "logs": [LOG], "retry_delay": 0.2}
    )
    async with ReplicationEndpoint(a_cfg) as a:
        for i in range(4):
            await a.journal.persist(f"{LOG}|d", [{"v": i}])
        await a.store.stamp(LOG)
        assert await a.delete(LOG, 100, physically_after=["B"]) == 4  # applied: as far as the log goes
        seen = [e.event async for e in a.journal.current_events_by_slices(LOG, 0, 1023)]
        assert seen == []  # logically deleted: local reads skip them
        events, _ = await a.store.read_log(LOG, 0, 10)
        assert len(events) == 4  # B has not read them: still there for replication
        b_cfg = EndpointConfig.from_dict(
            {"location": "B", "dsn": dbs["B"], "listen": addresses["B"], "logs": [LOG],
             "connections": [{"address": addresses["A"]}], "retry_delay": 0.2}
        )  # fmt: skip
        async with ReplicationEndpoint(b_cfg) as b:
            await wait_count(b.store, 4)

            async def a_knows_b_stored_all() -> bool:  # B's next read tells A it stored everything
                return int((await a.store.target_progress(LOG)).get("B", 0)) >= 4

            await wait_until(a_knows_b_stored_all, 60, "A to learn that B stored everything", every=0.05)
        assert await a.delete(LOG, 4, physically_after=["B"]) == 4
        events, _ = await a.store.read_log(LOG, 0, 10)
        assert len(events) == 1  # the pid's highest event stays (its tombstone keeps the seq_nr)
        assert await a.journal.highest_seq_nr(f"{LOG}|d") == 4


async def test_replicated_entities_refuse_local_writes_until_recovery_succeeds(dbs: dict[str, str]) -> None:
    from conftest import truncate_all

    from journal.errors import JournalUnavailable, LocalWritesRefused
    from journal.replication.entity import ReplicatedEntities, ReplicatedEntity

    class Counter(ReplicatedEntity[int]):
        entity_type = LOG

        def initial_state(self) -> int:
            return 0

        def on_event(self, state: int, event: object) -> int:
            return state + 1

    await truncate_all(dbs["A"])
    dead = free_address()  # nobody listens there
    cfg = {"location": "A", "dsn": dbs["A"], "listen": free_address(), "logs": [LOG], "retry_delay": 0.2}
    async with ReplicationEndpoint(EndpointConfig.from_dict({**cfg, "connections": [{"address": dead}]})) as a:
        entities = ReplicatedEntities(a.journal, a.store)
        assert (await entities.persist(Counter("x"), [{}])).state == 1
        with pytest.raises(JournalUnavailable):
            await a.recover()
        with pytest.raises(LocalWritesRefused):
            await entities.persist(Counter("x"), [{}])
    async with ReplicationEndpoint(EndpointConfig.from_dict(cfg)) as a:  # no peers left to wait for
        await a.recover()
        entities = ReplicatedEntities(a.journal, a.store)
        assert (await entities.persist(Counter("x"), [{}])).state == 2


async def test_private_tags_from_the_config_never_leave(dbs: dict[str, str]) -> None:
    from conftest import truncate_all

    for db in dbs.values():
        await truncate_all(db)
    addresses = {n: free_address() for n in "AB"}
    a_cfg = {"location": "A", "dsn": dbs["A"], "listen": addresses["A"], "logs": [LOG], "private_tags": ["mine"]}
    b_cfg = {"location": "B", "dsn": dbs["B"], "listen": addresses["B"], "logs": [LOG], "retry_delay": 0.2,
             "connections": [{"address": addresses["A"]}]}  # fmt: skip
    async with (
        ReplicationEndpoint(EndpointConfig.from_dict(a_cfg)) as a,
        ReplicationEndpoint(EndpointConfig.from_dict(b_cfg)) as b,
    ):
        await a.journal.persist(f"{LOG}|p", [{"v": "private"}], tags=["mine"])
        await a.journal.persist(f"{LOG}|q", [{"v": "public"}], tags=["other"])
        await wait_count(b.store, 1)

        async def b_read_both() -> bool:
            return int(await b.store.progress(LOG, "A")) >= 2

        await wait_until(b_read_both, 60, "B to read past both events", every=0.05)
        got = [e.event async for e in b.journal.current_events_by_slices(LOG, 0, 1023)]
        assert got == [{"v": "public"}]


async def test_a_mesh_over_grpc_delivers_an_event_filtered_on_one_link_by_another(dbs: dict[str, str]) -> None:
    """Endpoints A, B, C all pulling from each other; A's filter keeps ``secret-ish`` events from
    C. C gets A's later event directly first (its version vector then covers the filtered one),
    and still stores the filtered one, once, through B."""
    from conftest import truncate_all

    from journal.replication.filters import EndpointFilters, tagged

    for db in dbs.values():
        await truncate_all(db)
    addresses = {n: free_address() for n in "ABC"}

    def config(n: str, pulls: str) -> EndpointConfig:
        return EndpointConfig.from_dict(
            {"location": n, "dsn": dbs[n], "listen": addresses[n], "logs": [LOG], "batch_size": 2,
             "connections": [{"address": addresses[m]} for m in pulls], "retry_delay": 0.2}
        )  # fmt: skip

    not_for_c = EndpointFilters(target_locations={"C": ~tagged("not-for-c")})
    async with ReplicationEndpoint(config("A", "BC"), filters=not_for_c) as a:
        await a.journal.persist(f"{LOG}|1", [{"v": "e1"}], tags=["not-for-c"])
        await a.journal.persist(f"{LOG}|2", [{"v": "e2"}])
        async with ReplicationEndpoint(config("C", "A")) as c:  # C pulls from A only, for now
            await wait_count(c.store, 1)
            assert await c.store.event_ids(LOG) == {("A", 2): 1}
            assert (await c.store.version_vector(LOG)).get("A") == 2  # covers e1, which C has not
        async with ReplicationEndpoint(config("B", "AC")) as b, ReplicationEndpoint(config("C", "AB")) as c:
            await wait_count(b.store, 2)
            await wait_count(c.store, 2)
            for store in (a.store, b.store, c.store):
                assert await store.event_ids(LOG) == {("A", 1): 1, ("A", 2): 1}
