"""Slice queries against a real PostgreSQL: order, paging, resume, horizon, bad input, plan."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest
from slice_helpers import Consumer, LateWriter, collect, request

from journal import (
    InvalidArgument,
    Journal,
    JournalSettings,
    JournalUnavailable,
    NoOffset,
    OffsetError,
    SequenceOffset,
    TimestampOffset,
    open_journal,
    slice_ranges,
)
from journal.ids import slice_for
from journal.postgres.slice_queries import SliceStatements
from tests.support.waiting import wait_until


@pytest.fixture
async def small(journal: Journal, dsn: str) -> AsyncIterator[Journal]:
    """A journal (over the emptied tables) with pages of 10 (25 far from the tail), fast polling."""
    s = JournalSettings.load(env={}, dsn=dsn, buffer_size=10, catch_up_buffer_size=25, refresh_interval=0.2)
    async with open_journal(dsn, settings=s) as j:
        yield j


def key(e: object) -> tuple[str, int]:
    return (e.persistence_id, e.seq_nr)  # type: ignore[attr-defined]


async def test_current_events_by_slices_in_order_across_ranges(small: Journal) -> None:
    for i in range(40):
        await small.persist(f"cart|{i}", [{"i": i, "n": 1}, {"i": i, "n": 2}])
    seen: list[tuple[str, int]] = []
    for lo, hi in slice_ranges(4):
        envs = await collect(small.current_events_by_slices("cart", lo, hi))
        assert all(lo <= e.slice <= hi for e in envs)
        stamps = [(e.db_timestamp, e.seq_nr) for e in envs]
        assert stamps == sorted(stamps)
        assert all(isinstance(e.offset, TimestampOffset) for e in envs)
        seen += [key(e) for e in envs]
    assert sorted(seen) == sorted((f"cart|{i}", n) for i in range(40) for n in (1, 2))
    assert await collect(small.current_events_by_slices("other", 0, 1023)) == []


async def test_resume_from_every_offset_gives_exactly_the_remainder(small: Journal) -> None:
    # 3 pids persisting 7 events at once (one shared timestamp each) plus singles: more than a
    # page of events shares a timestamp, and resumes land mid-timestamp.
    await asyncio.gather(*(small.persist(f"acc|b{i}", [{"k": k} for k in range(7)]) for i in range(3)))
    for i in range(12):
        await small.persist(f"acc|s{i}", [{"k": i}])
    full = await collect(small.current_events_by_slices("acc", 0, 1023))
    assert len(full) == 3 * 7 + 12
    assert len({key(e) for e in full}) == len(full)
    for i, env in enumerate(full):
        rest = await collect(small.current_events_by_slices("acc", 0, 1023, env.offset))  # type: ignore[arg-type]
        assert [key(e) for e in rest] == [key(e) for e in full[i + 1 :]], f"resume after #{i}"
    again = await collect(small.current_events_by_slices("acc", 0, 1023, NoOffset()))
    assert [key(e) for e in again] == [key(e) for e in full]


async def test_many_events_share_one_timestamp_across_page_boundary(small: Journal, dsn: str) -> None:
    await small.persist("big|x", [{"n": n} for n in range(35)])
    # this library stamps rows one microsecond apart; other writers (the JVM plugin's concurrent
    # transactions) can still share one: made here by hand
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("UPDATE event_journal SET db_timestamp = (SELECT min(db_timestamp) FROM event_journal)")
    finally:
        await conn.close()
    got = await collect(small.current_events_by_slices("big", 0, 1023))
    assert [e.seq_nr for e in got] == list(range(1, 36))
    last = got[-1].offset
    assert isinstance(last, TimestampOffset) and last.seen == {"big|x": 35}
    mid = got[14].offset
    assert isinstance(mid, TimestampOffset) and mid.seen == {"big|x": 15}
    assert [e.event for e in got][:2] == [{"n": 0}, {"n": 1}]


async def test_horizon_holds_below_an_open_writer(journal: Journal, dsn: str) -> None:
    await journal.persist("h|before", [1])
    late = LateWriter(journal, dsn)
    rows = await late.begin_and_write([request(journal, "h|late", ["late"])])
    late_ts = rows[0]["db_timestamp"]
    await journal.persist("h|after", [2])  # commits first, with a later timestamp
    h = await journal.horizon()
    assert h <= late_ts
    got = [e.persistence_id for e in await collect(journal.current_events_by_slices("h", 0, 1023))]
    assert got == ["h|before"]  # h|after is above the horizon: not delivered yet
    await late.commit()
    h2 = await journal.horizon()
    assert h2 > late_ts
    got = [e.persistence_id for e in await collect(journal.current_events_by_slices("h", 0, 1023))]
    assert got == ["h|before", "h|late", "h|after"]


async def test_horizon_rolled_back_writer_leaves_nothing(journal: Journal, dsn: str) -> None:
    late = LateWriter(journal, dsn)
    await late.begin_and_write([request(journal, "rb|x", ["gone"])])
    await journal.persist("rb|y", ["kept"])
    await late.rollback()
    got = [e.persistence_id for e in await collect(journal.current_events_by_slices("rb", 0, 1023))]
    assert got == ["rb|y"]


async def test_backtracking_mode_current_query(journal: Journal) -> None:
    await journal.persist("bt|a", [1, 2])

    async def aged() -> list[tuple[str, int]]:  # behind_current_time is 100 ms: the rows must age past it
        return [key(e) for e in await collect(journal.current_events_by_slices("bt", 0, 1023, mode="backtracking"))]

    assert await wait_until(aged, 10, "both events older than behind_current_time") == [("bt|a", 1), ("bt|a", 2)]


async def test_live_query_polls_and_delivers_new_events(small: Journal) -> None:
    c = Consumer(small.events_by_slices("live", 0, 1023))
    try:
        await small.persist("live|a", [1, 2, 3])
        await wait_until(lambda: len(c.events) == 3, 10, "3 events")
        await small.persist("live|b", [4])
        await wait_until(lambda: len(c.events) == 4, 10, "4 events")
        assert [key(e) for e in c.events] == [("live|a", 1), ("live|a", 2), ("live|a", 3), ("live|b", 1)]
        assert c.events[0].event == 1
    finally:
        await c.stop()


async def test_bad_input_is_refused_before_io(journal: Journal) -> None:
    with pytest.raises(InvalidArgument, match="inverted"):
        journal.current_events_by_slices("x", 10, 5)
    with pytest.raises(InvalidArgument):
        journal.events_by_slices("x", 0, 1024)
    with pytest.raises(InvalidArgument):
        journal.current_events_by_slices("x", -1, 5)
    with pytest.raises(InvalidArgument):
        journal.current_events_by_slices("a|b", 0, 5)
    with pytest.raises(InvalidArgument):
        journal.current_events_by_slices(42, 0, 5)  # type: ignore[arg-type]
    with pytest.raises(OffsetError):
        journal.current_events_by_slices("x", 0, 5, SequenceOffset(3))  # type: ignore[arg-type]
    with pytest.raises(OffsetError):
        journal.events_by_slices("x", 0, 5, "2024-01-01")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="mode"):
        journal.current_events_by_slices("x", 0, 5, mode="sometimes")  # type: ignore[arg-type]


async def test_slice_page_uses_the_slice_index(journal: Journal, dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, "
            "event_ser_id, event_ser_manifest, event_payload, writer) "
            "SELECT g % 1024, 'ix', 'ix|' || g, 1, now() - (g || ' ms')::interval, 1, '', '\\x7b7d', 'w' "
            "FROM generate_series(1, 50000) g"
        )
        await conn.execute("ANALYZE event_journal")
        now = await conn.fetchval("SELECT now()")
        sql = SliceStatements("public").page(with_payload=True)
        plan = await conn.fetch(
            "EXPLAIN " + sql,
            "ix",
            list(range(256)),
            now - timedelta(seconds=20),
            now - timedelta(seconds=19),
            [],
            [],
            1000,
        )
        text = "\n".join(r[0] for r in plan)
        assert "event_journal_slice_idx" in text, text
        probe = await conn.fetch(
            "EXPLAIN " + SliceStatements("public").next_timestamp, "ix", 0, 255, now - timedelta(seconds=20), now
        )
        assert "event_journal_slice_idx" in "\n".join(r[0] for r in probe)
    finally:
        await conn.close()
    # The journal's query reads the backlog through bounded windows and finds all of it.
    got = await collect(journal.current_events_by_slices("ix", 0, 255))
    assert len(got) == sum(1 for g in range(1, 50001) if g % 1024 <= 255)


async def test_timestamp_of_load_envelope_and_live_by_pid(journal: Journal) -> None:
    envs = await journal.persist("p|1", ["a", "b"])
    assert await journal.timestamp_of("p|1", 2) == envs[1].db_timestamp
    assert await journal.timestamp_of("p|1", 3) is None
    env = await journal.load_envelope("p|1", 1)
    assert env is not None and env.event == "a" and env.offset == TimestampOffset(envs[0].db_timestamp, {"p|1": 1})
    assert await journal.load_envelope("p|2", 1) is None
    c = Consumer(journal.events_by_persistence_id("p|1", 2))
    try:
        await wait_until(lambda: len(c.events) == 1, 10, "seq 2")
        await journal.persist("p|1", ["c"])
        await wait_until(lambda: len(c.events) == 2, 5, "seq 3 (woken by NOTIFY)")
        assert [(e.seq_nr, e.event, e.offset) for e in c.events] == [
            (2, "b", SequenceOffset(2)),
            (3, "c", SequenceOffset(3)),
        ]
    finally:
        await c.stop()
    assert slice_for("p|1") == env.slice


async def test_live_query_ends_when_its_journal_closes(dsn: str, journal: Journal) -> None:
    s = JournalSettings.load(env={}, dsn=dsn, refresh_interval=5.0)
    async with open_journal(dsn, settings=s) as j:
        it = j.events_by_slices("closing", 0, 1023)
        task = asyncio.ensure_future(it.__anext__())
        await asyncio.sleep(0.3)  # an absence: the live query is still waiting for events
        assert not task.done()
    with pytest.raises(JournalUnavailable):
        await asyncio.wait_for(task, 3.0)
