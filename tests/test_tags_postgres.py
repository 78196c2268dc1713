"""Events by tag on PostgreSQL: the tag rows written with the events, the query, the tag writer
(recovery, retries, back-pressure) and gap detection, against the real database."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from conftest import truncate_all

from journal import (
    ConfigurationError,
    InvalidArgument,
    Journal,
    JournalSettings,
    OffsetError,
    TagEventsMissing,
    TimeUUIDOffset,
    open_journal,
)
from journal.postgres.backend import PostgresBackend
from journal.serialization import Serialized
from journal.tags.buckets import bucket_of
from journal.tags.query import TagQuery
from journal.tags.store import TaggedEvent, TagRow, TagStore
from journal.tags.timeuuid import timeuuid_for_event
from journal.tags.writer import TagWriters, TagWriteTimeout
from tests.support.waiting import wait_until

FAST = dict(
    eventual_consistency_delay=0.0,
    query_refresh_interval=0.05,
    gap_timeout=1.5,
    back_track_interval=0.1,
    back_track_period=2.0,
    tag_write_timeout=1.0,
    retry_initial_backoff=0.02,
    retry_max_backoff=0.1,
)


def tag_settings(dsn: str, **more: Any) -> JournalSettings:
    return JournalSettings.load(env={}, dsn=dsn, **{**FAST, **more})


@pytest.fixture
async def tj(dsn: str) -> AsyncIterator[Journal]:
    await truncate_all(dsn)
    async with open_journal(dsn, settings=tag_settings(dsn)) as j:
        yield j


def store_of(j: Journal) -> TagStore:
    assert isinstance(j.backend, PostgresBackend)
    return j.backend.tag_store()


async def collect(it: AsyncIterator[Any]) -> list[Any]:
    return [x async for x in it]


async def test_tagged_persist_writes_tag_rows_in_the_same_statement(tj: Journal, dsn: str) -> None:
    envs = await tj.persist("Acc|1", [{"n": 1}, {"n": 2}], tags=["blue", "red"])
    await tj.persist("Acc|2", [{"n": 3}], tags=["blue"])
    await tj.persist("Acc|3", [{"n": 4}])  # untagged: the fast path, no tag rows
    blue = await collect(tj.current_events_by_tag("blue"))
    assert [(e.persistence_id, e.seq_nr, e.event) for e in blue] == [
        ("Acc|1", 1, {"n": 1}), ("Acc|1", 2, {"n": 2}), ("Acc|2", 1, {"n": 3})
    ]
    assert all(isinstance(e.offset, TimeUUIDOffset) for e in blue)
    # the UUID is the deterministic one the Python side computes (so resends are idempotent)
    assert blue[0].offset == TimeUUIDOffset(timeuuid_for_event(envs[0].db_timestamp, "Acc|1", 1))
    assert blue[0].db_timestamp == envs[0].db_timestamp and blue[0].entity_type == "Acc"
    assert [e.seq_nr for e in await collect(tj.current_events_by_tag("red"))] == [1, 2]
    # resume after an offset (exclusive)
    rest = await collect(tj.current_events_by_tag("blue", blue[0].offset))
    assert [(e.persistence_id, e.seq_nr) for e in rest] == [("Acc|1", 2), ("Acc|2", 1)]
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT tag_name, persistence_id, tag_pid_sequence_nr, sequence_nr FROM tag_views ORDER BY 1, 2, 3"
        )
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [
        ("blue", "Acc|1", 1, 1), ("blue", "Acc|1", 2, 2), ("blue", "Acc|2", 1, 1),
        ("red", "Acc|1", 1, 1), ("red", "Acc|1", 2, 2),
    ]


async def test_bad_tags_and_offsets_refused_before_io(tj: Journal) -> None:
    for bad in ("", "x" * 256, "a\x00b"):
        with pytest.raises(InvalidArgument):
            await tj.persist("Acc|1", [1], tags=[bad])
        with pytest.raises(InvalidArgument):
            tj.current_events_by_tag(bad)
    with pytest.raises(OffsetError):
        tj.current_events_by_tag("t", 42)  # type: ignore[arg-type]
    with pytest.raises(OffsetError):
        TimeUUIDOffset("not-a-uuid")  # type: ignore[arg-type]
    assert await tj.highest_seq_nr("Acc|1") == 0


async def test_many_concurrent_writers_exactly_once_in_order_per_pid(tj: Journal) -> None:
    """Concurrent persists (group commit) with tags; a live query running meanwhile sees every
    event once, each pid in order."""
    pids = [f"Acc|{i}" for i in range(20)]
    per_pid = 15
    seen: list[tuple[str, int]] = []
    done = asyncio.Event()

    async def consume() -> None:
        async for e in tj.events_by_tag("shared"):
            seen.append((e.persistence_id, e.seq_nr))
            if len(seen) == len(pids) * per_pid:
                done.set()
                return

    consumer = asyncio.create_task(consume())

    async def writer(pid: str) -> None:
        for i in range(per_pid):
            await tj.persist(pid, [{"i": i}], tags=["shared", pid.replace("|", "-")])
            await asyncio.sleep(random.random() * 0.003)

    await asyncio.gather(*(writer(p) for p in pids))
    await asyncio.wait_for(done.wait(), 20)
    await consumer
    assert len(seen) == len(set(seen)) == len(pids) * per_pid
    for p in pids:
        assert [s for q, s in seen if q == p] == list(range(1, per_pid + 1))


def _row(pid: str, n: int, ts: datetime, tag: str = "g", size: str = "Hour") -> TagRow:
    u = timeuuid_for_event(ts, pid, n)
    return TagRow(tag, bucket_of(u, size), u, pid, n, n, "w", Serialized(1, "", b'{"n": %d}' % n))


async def test_writers_across_bucket_boundaries_minute_bucket(dsn: str) -> None:
    """Many concurrent tag writers (the Cassandra write path) over the Postgres store, events
    spread over several Minute buckets: each delivered once per tag, in order per pid."""
    await truncate_all(dsn)
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10)
    s = tag_settings(
        dsn, bucket_size="Minute", first_time_bucket=start.strftime("%Y%m%dT%H:%M"), max_message_batch_size=7
    )
    async with open_journal(dsn, settings=s) as j:
        store = store_of(j)
        writers = TagWriters(store, s.tags)
        pids = [f"W|{i}" for i in range(12)]
        n_per = 25

        async def entity(pid: str) -> None:
            await writers.ensure_recovered(pid)
            for seq in range(1, n_per + 1):
                ts = start + timedelta(seconds=seq * 13, microseconds=random.randrange(1_000_000))
                ev = TaggedEvent(pid, seq, timeuuid_for_event(ts, pid, seq), ("a", "b"), Serialized(1, "", b"1"), "w")
                await writers.write([ev])

        await asyncio.gather(*(entity(p) for p in pids))
        await writers.close()
        assert any(w.batches_written > 1 for w in writers.writers.values())
        for tag in ("a", "b"):
            got = [(e.persistence_id, e.seq_nr) async for e in j.current_events_by_tag(tag)]
            assert len(got) == len(set(got)) == len(pids) * n_per
            for p in pids:
                assert [q for x, q in got if x == p] == list(range(1, n_per + 1))
        conn = await asyncpg.connect(dsn)
        try:
            buckets = await conn.fetch("SELECT DISTINCT timebucket FROM tag_views")
        finally:
            await conn.close()
        assert len(buckets) >= 5 and all(b[0] % 60_000 == 0 for b in buckets)


async def test_journal_minute_bucket(dsn: str) -> None:
    await truncate_all(dsn)
    async with open_journal(dsn, settings=tag_settings(dsn, bucket_size="Minute")) as j:
        await j.persist("M|1", [1, 2, 3], tags=["m"])
        got = await collect(j.current_events_by_tag("m"))
        assert [e.event for e in got] == [1, 2, 3]
        assert all(bucket_of(e.offset.value, "Minute") % 60_000 == 0 for e in got)


async def test_bucket_size_change_refused_once_data_exists(dsn: str) -> None:
    await truncate_all(dsn)
    async with open_journal(dsn, settings=tag_settings(dsn, bucket_size="Hour")) as j:
        pass
    async with open_journal(dsn, settings=tag_settings(dsn, bucket_size="Day")) as j:  # no data yet: allowed
        await j.persist("B|1", [1], tags=["t"])
    with pytest.raises(ConfigurationError, match=r"'Day'.*cannot change to 'Minute'"):
        async with open_journal(dsn, settings=tag_settings(dsn, bucket_size="Minute")):
            pass
    async with open_journal(dsn, settings=tag_settings(dsn, bucket_size="Day")) as j:
        assert [e.event for e in await collect(j.current_events_by_tag("t"))] == [1]


async def test_gap_search_finds_a_delayed_row(tj: Journal) -> None:
    store = store_of(tj)
    now = datetime.now(UTC) - timedelta(seconds=30)
    r1, r2, r3 = (_row("G|1", n, now + timedelta(milliseconds=n)) for n in (1, 2, 3))
    await store.write_tag_rows([r1, r3])  # r2 is "late" (committed after r3 is visible)

    async def late() -> None:
        await asyncio.sleep(0.4)
        await store.write_tag_rows([r2])

    t = asyncio.create_task(late())
    got = await collect(tj.current_events_by_tag("g"))
    await t
    assert [e.event for e in got] == [{"n": 1}, {"n": 2}, {"n": 3}]


async def test_gap_that_never_fills_fails_naming_pid_tag_and_range(tj: Journal) -> None:
    store = store_of(tj)
    now = datetime.now(UTC) - timedelta(seconds=30)
    await store.write_tag_rows([_row("G|2", n, now + timedelta(milliseconds=n)) for n in (1, 2, 5)])
    got: list[Any] = []
    t0 = time.monotonic()
    with pytest.raises(TagEventsMissing) as ei:
        async for e in tj.current_events_by_tag("g"):
            got.append(e.event)
    assert time.monotonic() - t0 >= FAST["gap_timeout"]
    assert [g["n"] for g in got] == [1, 2]
    err = ei.value
    assert (err.persistence_id, err.tag, err.from_seq_nr, err.to_seq_nr) == ("G|2", "g", 3, 4)
    assert "'G|2'" in str(err) and "'g'" in str(err) and "3..4" in str(err)


async def test_live_query_back_tracks_for_a_late_first_event_of_a_new_pid(tj: Journal) -> None:
    store = store_of(tj)
    base = datetime.now(UTC) - timedelta(seconds=1)
    await store.write_tag_rows([_row("L|1", 1, base)])
    late = _row("L|2", 1, base - timedelta(milliseconds=300))  # older UUID, arrives later
    got: list[str] = []

    async def consume() -> None:
        async for e in tj.events_by_tag("g"):
            got.append(e.persistence_id)
            if len(got) == 2:
                return

    task = asyncio.create_task(consume())
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:  # noqa: ASYNC110 (poll a condition with a deadline)
        await asyncio.sleep(0.02)
    await store.write_tag_rows([late])
    await asyncio.wait_for(task, 5)
    assert got == ["L|1", "L|2"]


async def test_recovery_after_crash_between_tag_write_and_progress(tj: Journal, dsn: str) -> None:
    """Tag rows are stored but the progress never was (crash in between), and some rows were
    lost entirely (crash before the tag write, as on Cassandra): recovery resends with the same
    UUIDs and numbers; nothing lost, nothing doubled."""
    for i in range(6):
        await tj.persist("R|1", [{"i": i}], tags=["x", "y"] if i % 2 else ["x"])
    before = await collect(tj.current_events_by_tag("x"))
    conn = await asyncpg.connect(dsn)
    try:
        original = await conn.fetch("SELECT * FROM tag_views ORDER BY tag_name, tag_pid_sequence_nr")
        await conn.execute("DELETE FROM tag_views WHERE tag_name = 'x' AND tag_pid_sequence_nr > 3")
        assert await conn.fetchval("SELECT count(*) FROM tag_write_progress") == 0
        s = tag_settings(dsn).tags
        writers = TagWriters(store_of(tj), s)
        resent = await writers.recover("R|1")
        await writers.close()
        assert resent == 9  # 6 for x, 3 for y: all above the (missing) progress
        after = await conn.fetch("SELECT * FROM tag_views ORDER BY tag_name, tag_pid_sequence_nr")
        progress = await conn.fetch("SELECT tag, sequence_nr, tag_pid_sequence_nr FROM tag_write_progress ORDER BY tag")
        scanning = await conn.fetchval("SELECT sequence_nr FROM tag_scanning WHERE persistence_id = 'R|1'")
    finally:
        await conn.close()
    assert [dict(r) for r in after] == [dict(r) for r in original]
    assert [tuple(r) for r in progress] == [("x", 6, 6), ("y", 6, 3)]
    assert scanning == 6
    assert [e.offset for e in await collect(tj.current_events_by_tag("x"))] == [e.offset for e in before]
    # a second recovery finds everything done
    writers = TagWriters(store_of(tj), s)
    assert await writers.recover("R|1") == 0
    await writers.close()


class FlakyStore:
    """The real Postgres store, with tag-row writes failing while ``failing`` is set
    (fault injection around the real database, not a mock)."""

    def __init__(self, inner: TagStore) -> None:
        self.inner = inner
        self.failing = True
        self.failures = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def write_tag_rows(self, rows: Any) -> None:
        if self.failing:
            self.failures += 1
            raise ConnectionError("injected: tag store unreachable")
        await self.inner.write_tag_rows(rows)


async def test_failing_tag_write_times_out_and_next_recovery_resends(tj: Journal, dsn: str) -> None:
    store = FlakyStore(store_of(tj))
    s = tag_settings(dsn).tags
    writers = TagWriters(store, s)  # type: ignore[arg-type]
    base = datetime.now(UTC) - timedelta(seconds=20)

    def ev(seq: int) -> TaggedEvent:
        ts = base + timedelta(milliseconds=seq)
        return TaggedEvent("F|1", seq, timeuuid_for_event(ts, "F|1", seq), ("f",), Serialized(1, "", b"%d" % seq), "w")

    conn = await asyncpg.connect(dsn)

    async def store_events(*seqs: int) -> None:  # the messages write (recovery's source)
        for seq in seqs:
            await conn.execute(
                "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
                "event_ser_manifest, event_payload, writer, tags) VALUES (0, 'F', 'F|1', $1, $2, 1, '', $3, 'w', $4)",
                seq, base + timedelta(milliseconds=seq), b"%d" % seq, ["f"],
            )  # fmt: skip

    try:
        await writers.ensure_recovered("F|1")
        await store_events(1, 2)
        t0 = time.monotonic()
        with pytest.raises(TagWriteTimeout):
            await writers.write([ev(1), ev(2)])
        assert time.monotonic() - t0 >= s.tag_write_timeout
        assert store.failures >= 3  # retried with backoff meanwhile
        assert await conn.fetchval("SELECT count(*) FROM tag_views") == 0
        store.failing = False  # the store comes back; the writer's own retry may land too
        await writers.ensure_recovered("F|1")  # the pid's next write: recovery resends 1 and 2
        await store_events(3)
        await writers.write([ev(3)])
        await writers.close()
        rows = await conn.fetch("SELECT sequence_nr, tag_pid_sequence_nr FROM tag_views ORDER BY 2")
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [(1, 1), (2, 2), (3, 3)]


async def test_back_pressure_bounded_buffer(tj: Journal, dsn: str) -> None:
    store = FlakyStore(store_of(tj))
    s = tag_settings(dsn, max_buffered_events=5, max_message_batch_size=2, tag_write_timeout=10.0).tags
    writers = TagWriters(store, s)  # type: ignore[arg-type]
    await writers.recover("P|1")
    w = writers.writer("p")
    base = datetime.now(UTC) - timedelta(seconds=20)
    added = 0

    async def produce() -> None:
        nonlocal added
        for seq in range(1, 21):
            ts = base + timedelta(milliseconds=seq)
            u = timeuuid_for_event(ts, "P|1", seq)
            await w.add(TaggedEvent("P|1", seq, u, ("p",), Serialized(1, "", b"1"), "w"))
            added += 1

    task = asyncio.create_task(produce())
    await wait_until(lambda: store.failures >= 2, 3, "two failed tag writes")
    await asyncio.sleep(0.1)
    assert added <= 5 + 2  # buffer full (plus the batch in flight): the producer waits
    store.failing = False
    await asyncio.wait_for(task, 10)
    await wait_until(lambda: not w.state.buffer and not w.state.in_flight, 5, "the writer to drain its buffer")
    await writers.close()
    q = TagQuery(store_of(tj), "p", s, after=None, live=False)
    assert [r.tag_pid_seq_nr async for r in q.rows()] == list(range(1, 21))
