"""Endpoints in this process: availability subscriptions and the application version check."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
from endpoint_processes import free_address
from replication_helpers import location_databases

from journal.errors import ConfigurationError
from journal.replication.availability import Available, FailureDetector, Unavailable
from journal.replication.config import EndpointConfig
from journal.replication.endpoint import ReplicationEndpoint
from journal.replication.versions import Application

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
        async with asyncio.timeout(60):
            while len(await c.store.event_ids(LOG)) != 1:  # noqa: ASYNC110 (another database's state)
                await asyncio.sleep(0.05)
        assert await b.store.event_ids(LOG) == {}
        assert Application("shop", "1.3").parts == (1, 3)
