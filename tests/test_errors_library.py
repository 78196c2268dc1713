"""The library's side of the same failures: every driver error at connect or at a statement comes
out as the error tree (ConfigurationError for what will not fix itself, JournalUnavailable for
what may), naming the server and the cause, within the connect timeout and the retry budget.
Bad input is refused at the edge, before anything runs or is written.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial
from typing import Any

import asyncpg
import pytest
from cassandra_fixtures import open_test_journal

from journal import (
    ConfigurationError,
    InvalidArgument,
    JournalError,
    JournalSettings,
    JournalUnavailable,
    SerializationError,
    open_journal,
)
from journal.postgres.migrations import upgrade
from projections import Worker
from projections.handlers import check_handler
from projections.stats import Stats
from tests.support.password_server import PasswordServer, free_port
from tests.support.scratch import scratch_database
from tests.support.waiting import wait_until

FAST = {"connect_timeout": 0.5, "budget": 1.0}


@pytest.fixture(scope="module")
def silent_port() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)  # accepts (the kernel does), never answers
    yield s.getsockname()[1]
    s.close()


@pytest.fixture(scope="module")
def unmigrated(password_pg: PasswordServer) -> Iterator[str]:
    with scratch_database(password_pg.dsn(), "sjtmp") as db:
        yield db


HOST = r"127\.0\.0\.1:\d+"


@pytest.mark.parametrize(
    ("where", "error", "says", "bound"),
    [
        ("wrong password", ConfigurationError, rf'{HOST}/app: password authentication failed for user "app"', 3),
        ("missing database", ConfigurationError, rf'{HOST}/nope: database "nope" does not exist', 3),
        ("unmigrated database", ConfigurationError, rf"{HOST}/sjtmp_\w+ has no event_journal table", 3),
        ("closed port", JournalUnavailable, rf"cannot connect to {HOST}/app: connection refused", 3),
        ("silent server", JournalUnavailable, rf"cannot connect to {HOST}/app: no answer within 0\.5 s", 3),
        ("cassandra, no node", JournalUnavailable, rf"cannot connect to Cassandra at cassandra://{HOST}/ks", 8),
    ],
)
async def test_connect_failures_are_the_error_tree(
    where: str, error: type[JournalError], says: str, bound: float, password_pg: PasswordServer, silent_port: int,
    unmigrated: str,
) -> None:  # fmt: skip
    if where.startswith("cassandra"):
        pytest.importorskip("cassandra")
    closed = free_port()
    dsn = {
        "wrong password": password_pg.dsn(password="wrong"),
        "missing database": password_pg.dsn(database="nope"),
        "unmigrated database": unmigrated,
        "closed port": f"postgresql://app:x@127.0.0.1:{closed}/app",
        "silent server": f"postgresql://app:x@127.0.0.1:{silent_port}/app",
        "cassandra, no node": f"cassandra://127.0.0.1:{closed}/ks",
    }[where]
    started = time.monotonic()
    with pytest.raises(error, match=says) as info:
        async with open_journal(dsn, settings=JournalSettings.load(env={}, **FAST)):
            pass
    assert time.monotonic() - started < bound
    assert where == "unmigrated database" or info.value.__cause__ is not None  # raised from the driver's error
    assert "\n" not in str(info.value)


async def test_retries_at_connect_are_announced(caplog: pytest.LogCaptureFixture) -> None:
    closed = free_port()
    with caplog.at_level(logging.WARNING, logger="journal.postgres"), pytest.raises(JournalUnavailable) as info:
        async with open_journal(f"postgresql://app:x@127.0.0.1:{closed}/app", settings=JournalSettings.load(env={})):
            pass
    said = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert re.search(r"/app: connection refused \(no server listens there\); retrying 2/5 in [\d.]+ s$", said[0])
    assert len(said) == 4 and "(5 attempts in" in str(info.value)


async def test_an_explicit_empty_dsn_is_refused() -> None:
    for dsn in ("", "   "):
        with pytest.raises(ConfigurationError, match="the DSN given is empty"):
            async with open_journal(dsn):
                pass


@pytest.fixture
def migrated(server_dsn: str) -> Iterator[str]:
    with scratch_database(server_dsn, "sjtmp") as db:
        upgrade(db)
        yield db


async def test_a_statement_on_a_missing_table_is_a_configuration_error(migrated: str) -> None:
    async with open_journal(migrated, settings=JournalSettings.load(env={}, **FAST)) as j:
        conn = await asyncpg.connect(migrated)
        await conn.execute("DROP TABLE snapshot")
        await conn.close()
        missing = r"save snapshot on .*: relation \"public.snapshot\" does not exist: is the schema migrated"
        with pytest.raises(ConfigurationError, match=missing):
            await j.save_snapshot("Cart|1", 1, {"n": 1})


# -- the size and the content of events, on both backends --------------------------------------------


async def _stored(j: Any, pid: str) -> list[Any]:
    return [e.event async for e in j.current_events_by_persistence_id(pid)]


async def test_an_event_above_the_size_limit_is_refused_before_any_io(journal_target: str) -> None:
    limit = 2000
    async with open_test_journal(journal_target, max_event_bytes=limit) as j:
        big = {"blob": "x" * limit}
        with pytest.raises(InvalidArgument, match=r"event 0 of 'Big\|1' is 2,\d{3} bytes serialized, above write"):
            await j.persist("Big|1", [big])
        with pytest.raises(InvalidArgument, match=r"event 1 of 'Big\|1'"):
            await j.persist("Big|1", [{"ok": 1}, b"y" * (limit + 1)])
        with pytest.raises(InvalidArgument, match=r"the metadata of 'Big\|1'"):
            await j.persist("Big|1", [{"ok": 1}], metadata=big)
        with pytest.raises(InvalidArgument, match=r"persist_many part 1: event 0 of 'Big\|3'"):
            await j.persist_many([("Big|2", [{"ok": 1}], 0), ("Big|3", [big], 0)])
        assert await _stored(j, "Big|1") == [] and await _stored(j, "Big|2") == []
        fits = {"blob": "x" * (limit - 20)}
        await j.persist("Big|1", [fits])
        assert await _stored(j, "Big|1") == [fits]


LOSSY = [
    pytest.param({"tags": {"a", "b"}}, r"\['tags'\] is a set, which JSON cannot hold", id="set"),
    pytest.param({"at": datetime(2024, 1, 1, tzinfo=UTC)}, r"\['at'\] is a datetime, which reads back", id="datetime"),
    pytest.param({"id": uuid.UUID(int=1)}, r"\['id'\] is a UUID, which reads back as a str", id="uuid"),
    pytest.param({"x": math.nan}, r"\['x'\] is nan, which JSON stores as null", id="nan"),
    pytest.param({"x": [1, math.inf]}, r"\['x'\]\[1\] is inf", id="infinity"),
    pytest.param({1: "one"}, r"has the key 1 \(int\), which JSON stores as a string", id="int-key"),
    pytest.param({"pair": (1, 2)}, r"\['pair'\] is a tuple, which reads back as a list", id="tuple"),
    pytest.param({"price": Decimal("1.50")}, r"\['price'\] is a Decimal, which JSON cannot hold", id="decimal"),
    pytest.param((1, 2), r"is a tuple, which reads back as a list", id="top-level-tuple"),
]


@pytest.mark.parametrize(("event", "says"), LOSSY)
async def test_a_value_json_would_change_is_refused(journal_target: str, event: Any, says: str) -> None:
    """What persist accepts, replay gives back equal: a value JSON would change is refused."""
    async with open_test_journal(journal_target) as j:
        with pytest.raises(SerializationError, match=says):
            await j.persist("Lossy|1", [event])
        with pytest.raises(SerializationError, match=says):
            await j.persist("Lossy|1", [{"fine": 1}], metadata={"m": event})
        with pytest.raises(SerializationError, match=r"persist_many part 0"):
            await j.persist_many([("Lossy|2", [event], 0)])
        assert await _stored(j, "Lossy|1") == [] and await _stored(j, "Lossy|2") == []


async def test_values_json_carries_read_back_equal(journal_target: str) -> None:
    events = [
        {"s": "é✓", "i": 2**63 - 1, "f": 0.1, "neg": -0.0, "n": None, "b": True, "l": [1, [2, {"d": {}}]]},
        [1, "two", 3.5],
        "text",
        17,
    ]
    async with open_test_journal(journal_target) as j:
        await j.persist("Fine|1", events, metadata={"by": "test"})
        assert await _stored(j, "Fine|1") == events


# -- the edges of the projection workers ------------------------------------------------------------


async def ok(conn: Any, envelopes: Any) -> None:
    pass


class AsyncCallable:
    async def __call__(self, conn: Any, envelopes: Any) -> None:
        pass


def sync(conn: Any, envelopes: Any) -> None:
    pass


async def one(envelope: Any) -> None:
    pass


async def takes_mode(conn: Any, envelopes: Any, mode: str) -> None:
    pass


def test_handlers_are_checked_for_their_mode() -> None:
    for handler in (ok, AsyncCallable(), partial(takes_mode, mode="grouped")):
        assert check_handler(handler, "grouped") is handler
    assert check_handler(one, "at-least-once") is one
    for handler, says in (
        (sync, "is a plain function: the runner awaits it, so it must be `async def`"),
        (one, r"takes \(envelope\) but grouped mode calls it as handler\(conn, envelopes\)"),
        (takes_mode, r"takes \(conn, envelopes, mode\) but grouped mode"),
        (42, "is not callable"),
    ):
        with pytest.raises(ConfigurationError, match=says):
            check_handler(handler, "grouped")


@pytest.mark.parametrize(
    ("name", "entity_type", "handler", "says"),
    [
        ("", "Cart", ok, "projection name must not be empty"),
        ("  ", "Cart", ok, "projection name must not be blank"),
        ("p" * 256, "Cart", ok, "projection name is 256 characters, the limit is 255"),
        ("p", "", ok, "entity type must not be empty"),
        ("p", "   ", ok, "entity type must not be blank"),
        ("p", "Cart|1", ok, r"entity type must not contain '\|'"),
        ("p", "Cart", sync, "must be `async def`"),
        ("p", "Cart", one, "grouped mode calls it as handler"),
    ],
)
def test_a_worker_refuses_bad_input_when_built(
    name: str, entity_type: str, handler: Any, says: str, settings: JournalSettings
) -> None:
    with pytest.raises(JournalError, match=says):
        Worker(None, settings, name, entity_type, handler, "grouped")  # type: ignore[arg-type]


def test_an_idle_caught_up_range_shows_no_lag() -> None:
    """Lag is the age of the last batch's newest event only while events flow: once the query's
    heartbeat says everything is delivered, the range is caught up (it showed "lag 817 s")."""
    stats = Stats("p")
    old = datetime.now(UTC).replace(year=2020)
    stats.committed(5, old, key="0-511")
    assert stats.lag_seconds > 10**7
    stats.caught_up("0-511", datetime.now(UTC))
    assert stats.lag_seconds < 1.0
    stats.committed(1, old, key="512-1023")  # another range of the worker still behind: it shows
    assert stats.lag_seconds > 10**7


async def test_a_worker_that_caught_up_with_old_events_shows_a_small_lag(dsn: str, journal: Any) -> None:
    for i in range(20):
        await journal.persist(f"OldLag|{i}", [{"n": i}])
    await asyncio.sleep(3.0)  # the scenario: the events are already 3 s old when the worker starts
    settings = JournalSettings.load(env={}, dsn=dsn, lease_ttl=4, lease_renew_interval=0.5, heartbeat_interval=0.2)
    worker = Worker(journal, settings, "p-old-lag", "OldLag", ok, "grouped")
    task = asyncio.create_task(worker.run())
    try:
        await wait_until(lambda: worker.stats.events == 20, 20, "the worker to process the 20 events")
        await wait_until(lambda: worker.stats.lag_seconds < 1.5, 10, "the lag to fall once caught up", every=0.1)
    finally:
        worker.stop()
        await task
