"""The journal contract: behaviour every backend must have, one suite run against each.

Always against PostgreSQL, the journal over two PostgreSQL databases (partitions.databases,
partition_fixtures.py) and Cassandra (``CASSANDRA_CONTACT_POINTS``, else the session's local
node: see cassandra_fixtures.py). Never mocked.
Core's own tests go deeper on PostgreSQL; a few cases here overlap them on purpose.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from cassandra_fixtures import open_test_journal, recent_first_bucket

from journal import (
    Journal,
    JournalSettings,
    SequenceConflict,
    UnsupportedOperation,
    Write,
    Written,
    failures,
    open_journal,
)

FAST: dict[str, Any] = dict(eventual_consistency_delay=0.0, query_refresh_interval=0.05)

BACKENDS = [
    pytest.param("postgres", id="postgres"),
    pytest.param("partitioned", id="partitioned"),
    pytest.param("cassandra", id="cassandra", marks=pytest.mark.cassandra),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The DSN of the session's PostgreSQL database or of a Cassandra keyspace, or ``partitioned:``
    and two databases' DSNs (empty tables)."""
    if request.param == "cassandra":
        return str(request.getfixturevalue("cassandra_dsn"))
    if request.param == "partitioned":
        return PARTITIONED + " ".join(request.getfixturevalue("parts")[:2])
    return str(request.getfixturevalue("dsn"))


PARTITIONED = "partitioned:"


@asynccontextmanager
async def opened(target: str, **overrides: Any) -> AsyncIterator[Journal]:
    """A journal on the ``backend`` fixture's target (PostgreSQL tables truncated first)."""
    if target.startswith(PARTITIONED):  # the parts fixture emptied the tables
        settings = JournalSettings.load(env={}, databases=target.removeprefix(PARTITIONED).split(" "), **overrides)
        async with open_journal(settings=settings) as qj:
            yield qj
        return
    async with open_test_journal(target, **overrides) as tj:
        yield tj


@pytest.fixture
async def j(backend: str) -> AsyncIterator[Journal]:
    if backend.startswith("cassandra://"):
        settings = JournalSettings.load(env={}, first_time_bucket=recent_first_bucket(), **FAST)
        async with open_journal(backend, settings=settings) as cj:
            yield cj
        return
    async with opened(backend, **FAST) as pj:
        yield pj


async def events(j: Journal, pid: str) -> list[Any]:
    return [e.event async for e in j.current_events_by_persistence_id(pid)]


async def test_persist_replay_round_trip(j: Journal) -> None:
    envs = await j.persist("Acc|1", [{"n": 1}, "two", [3]], tags=["t"], metadata={"m": 1})
    assert [e.seq_nr for e in envs] == [1, 2, 3]
    got = [e async for e in j.current_events_by_persistence_id("Acc|1")]
    assert [e.event for e in got] == [{"n": 1}, "two", [3]]
    assert [e.seq_nr for e in got] == [1, 2, 3] and {e.entity_type for e in got} == {"Acc"}
    assert got[0].metadata == {"m": 1} and got[0].tags == ("t",)
    assert [e.seq_nr async for e in j.current_events_by_persistence_id("Acc|1", 2, 2)] == [2]


async def test_multi_event_persist_is_atomic_and_conflicts_write_nothing(j: Journal) -> None:
    await j.persist("Acc|2", [1, 2])
    with pytest.raises(SequenceConflict):
        await j.persist("Acc|2", [3, 4, 5], expected_seq_nr=1)  # the stored highest is 2
    assert await events(j, "Acc|2") == [1, 2]
    envs = await j.persist("Acc|2", [3, 4, 5], expected_seq_nr=2)
    assert [e.seq_nr for e in envs] == [3, 4, 5]
    assert await events(j, "Acc|2") == [1, 2, 3, 4, 5]


async def test_highest_seq_nr(j: Journal) -> None:
    assert await j.highest_seq_nr("Acc|none") == 0
    await j.persist("Acc|3", list(range(7)))
    await j.persist("Acc|3", [7])
    assert await j.highest_seq_nr("Acc|3") == 8


async def test_delete_events_to_keeps_the_highest(j: Journal) -> None:
    await j.persist("Del|1", list(range(10)))
    await j.delete_events_to("Del|1", 4)
    assert await events(j, "Del|1") == list(range(4, 10))
    assert await j.highest_seq_nr("Del|1") == 10
    await j.delete_events_to("Del|1", 100)  # beyond the highest: clamps
    assert await events(j, "Del|1") == []
    assert await j.highest_seq_nr("Del|1") == 10
    envs = await j.persist("Del|1", ["after"], expected_seq_nr=10)
    assert envs[0].seq_nr == 11 and await events(j, "Del|1") == ["after"]


async def test_persistence_ids(j: Journal) -> None:
    for i in range(6):
        await j.persist(f"a|{i:02}", [i])
    await j.persist("b|00", [0])
    await j.persist("a|00", ["again"])
    every = [p async for p in j.current_persistence_ids()]
    assert every == sorted(every) and len(every) == 7
    assert [p async for p in j.current_persistence_ids("b")] == ["b|00"]


async def test_snapshots_save_replace_load_delete(j: Journal) -> None:
    assert await j.load_snapshot("S|1") is None
    await j.save_snapshot("S|1", 5, {"v": 1}, metadata={"x": 1})
    snap = await j.load_snapshot("S|1")
    assert snap is not None and snap.seq_nr == 5 and snap.state == {"v": 1} and snap.metadata == {"x": 1}
    await j.save_snapshot("S|1", 9, {"v": 2})
    snap = await j.load_snapshot("S|1")
    assert snap is not None and snap.seq_nr == 9 and snap.state == {"v": 2} and snap.metadata is None
    await j.delete_snapshot("S|1")
    assert await j.load_snapshot("S|1") is None


async def test_several_snapshots_kept_newest_first(j: Journal) -> None:
    pid = f"S|keep-{uuid.uuid4().hex[:8]}"
    for seq in (2, 4, 6, 8):
        await j.save_snapshot(pid, seq, {"v": seq}, keep=3)
    snaps = await j.load_snapshots(pid)
    got = [(s.seq_nr, s.state) for s in snaps if not isinstance(s, Exception)]
    assert got == [(8, {"v": 8}), (6, {"v": 6}), (4, {"v": 4})]
    latest = await j.load_snapshot(pid)
    assert latest is not None and latest.seq_nr == 8
    await j.save_snapshot(pid, 10, {"v": 10})  # keep=1: replaces them all
    assert [s.seq_nr for s in await j.load_snapshots(pid) if not isinstance(s, Exception)] == [10]
    await j.delete_snapshot(pid)
    assert await j.load_snapshots(pid) == []


async def test_events_by_tag_exactly_once_in_order_per_pid(j: Journal) -> None:
    async def writer(pid: str) -> None:
        for i in range(6):
            await j.persist(pid, [i], tags=["t"] if i % 2 == 0 else ["u"])

    await asyncio.gather(*(writer(f"T|{k}") for k in range(4)))
    got = [(e.persistence_id, e.seq_nr, e.event) async for e in j.current_events_by_tag("t")]
    assert len(got) == len(set(got)) == 12
    for k in range(4):
        assert [(s, ev) for p, s, ev in got if p == f"T|{k}"] == [(1, 0), (3, 2), (5, 4)]
    # resuming after an offset delivers exactly the rest
    envs = [e async for e in j.current_events_by_tag("t")]
    rest = [(e.persistence_id, e.seq_nr) async for e in j.current_events_by_tag("t", envs[4].offset)]
    assert rest == [(e.persistence_id, e.seq_nr) for e in envs[5:]]


async def test_slice_queries_on_cassandra_raise_unsupported(j: Journal) -> None:
    if j.backend.name != "cassandra":
        assert [e async for e in j.current_events_by_slices("A", 0, 1023)] == []
        return
    with pytest.raises(UnsupportedOperation, match="use events_by_tag"):
        j.current_events_by_slices("A", 0, 1023)
    with pytest.raises(UnsupportedOperation, match="use events_by_tag"):
        j.events_by_slices("A", 0, 1023)


async def test_persist_many_each_part_atomic_and_conflict_checked_alone(j: Journal) -> None:
    await j.persist("pm|taken", ["a", "b"])
    out = await j.persist_many(
        [
            Write("pm|1", [1, 2], expected_seq_nr=0),
            Write("pm|taken", ["stale"], expected_seq_nr=1),
            Write("pm|2", [{"x": 3}], tags=["t"]),
            Write("pm|taken2", ["c"], expected_seq_nr=0),
        ]
    )
    assert [i for i, _ in failures(out)] == [1]
    assert isinstance(out[1], SequenceConflict)
    first = out[0]
    assert isinstance(first, Written) and (first.first_seq_nr, first.last_seq_nr) == (1, 2)
    assert await events(j, "pm|1") == [1, 2]
    assert await events(j, "pm|taken") == ["a", "b"]
    assert await events(j, "pm|2") == [{"x": 3}]
    assert await events(j, "pm|taken2") == ["c"]


async def test_replay_and_pid_listing_page_by_buffer_size(backend: str) -> None:
    async with opened(backend, buffer_size=3, **FAST) as j:
        for chunk in ([0, 1, 2, 3], [4], [5, 6, 7], [8, 9]):
            await j.persist("Page|1", chunk)
        assert await events(j, "Page|1") == list(range(10))
        assert [e.seq_nr async for e in j.current_events_by_persistence_id("Page|1", 4, 8)] == [4, 5, 6, 7, 8]
        await j.delete_events_to("Page|1", 5)
        assert [e.seq_nr async for e in j.current_events_by_persistence_id("Page|1", 1, 7)] == [6, 7]
        for i in range(7):
            await j.persist(f"Lst|{i}", [i])
        assert [p async for p in j.current_persistence_ids("Lst")] == [f"Lst|{i}" for i in range(7)]


async def test_live_events_by_tag_sees_later_writes_with_metadata(j: Journal) -> None:
    await j.persist("Live|1", [1], tags=["live"])
    got: list[tuple[str, int, Any]] = []

    async def consume() -> None:
        async for e in j.events_by_tag("live"):
            got.append((e.persistence_id, e.seq_nr, e.metadata))
            if len(got) == 4:
                return

    task = asyncio.create_task(consume())
    await j.persist("Live|2", [1, 2], tags=["live", "other"], metadata={"m": 2})
    await j.persist("Live|1", [2], tags=["live"])
    await asyncio.wait_for(task, 30)
    assert sorted(got, key=lambda g: (g[0], g[1])) == [
        ("Live|1", 1, None), ("Live|1", 2, None), ("Live|2", 1, {"m": 2}), ("Live|2", 2, {"m": 2}),
    ]  # fmt: skip
    assert [s for p, s, _ in got if p == "Live|2"] == [1, 2]
