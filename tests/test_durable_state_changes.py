"""Changes by slices of the durable state (issue 34) on a real PostgreSQL: the latest revision of
every changed pid, deletes as their own kind, offsets, live queries in both modes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from journal import (
    DeletedState,
    DurableState,
    Journal,
    JournalSettings,
    NoOffset,
    OffsetError,
    SequenceOffset,
    StateChange,
    UpdatedState,
    open_journal,
    slice_for,
)
from journal.postgres.dsn import asyncpg_dsn
from tests.conftest import truncate_all

MODES = ["horizon", "backtracking"]


@pytest.fixture
async def j(dsn: str) -> AsyncIterator[Journal]:
    await truncate_all(dsn)
    settings = JournalSettings.load(env={}, dsn=dsn, refresh_interval=0.05, behind_current_time=0.0)
    async with open_journal(dsn, settings=settings) as journal:
        yield journal


async def current(store: DurableState, mode: str, offset: object = None) -> list[StateChange]:
    return [c async for c in store.current_changes_by_slices("Cart", 0, 1023, offset, mode=mode)]  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", MODES)
async def test_current_changes_latest_revision_and_deletes(j: Journal, mode: str) -> None:
    store = j.durable_state()
    await store.upsert("Cart|a", 1, "a1")
    await store.upsert("Cart|b", 1, "b1")
    await store.upsert("Cart|a", 2, "a2")
    await store.upsert("Cart|c", 1, "c1")
    await store.delete("Cart|c", 2)
    await store.upsert("Other|x", 1, "not this entity type")
    got = await current(store, mode)
    assert [(type(c).__name__, c.persistence_id, c.revision) for c in got] == [
        ("UpdatedState", "Cart|b", 1),
        ("UpdatedState", "Cart|a", 2),
        ("DeletedState", "Cart|c", 2),
    ]
    assert isinstance(got[1], UpdatedState) and got[1].value == "a2"
    assert [c.db_timestamp for c in got] == sorted(c.db_timestamp for c in got)

    # from the offset of the last change: only what changed after it
    await store.upsert("Cart|a", 3, "a3")
    await store.upsert("Cart|c", 3, "c back")
    rest = await current(store, mode, got[-1].offset)
    assert [(c.persistence_id, c.revision) for c in rest] == [("Cart|a", 3), ("Cart|c", 3)]
    assert await current(store, mode, rest[-1].offset) == []
    # a hard delete is never delivered: the row is gone
    await store.hard_delete("Cart|b")
    assert [c.persistence_id for c in await current(store, mode, NoOffset())] == ["Cart|a", "Cart|c"]


async def test_changes_refuse_a_sequence_offset(j: Journal) -> None:
    with pytest.raises(OffsetError):
        j.durable_state().current_changes_by_slices("Cart", 0, 1023, SequenceOffset(3))  # type: ignore[arg-type]


async def test_stale_offset_catch_up_delivers_each_pid_once_at_its_latest(j: Journal) -> None:
    store = j.durable_state()
    await store.upsert("Cart|first", 1, 0)
    (start,) = await current(store, "horizon")
    pids = [f"Cart|{i}" for i in range(300)]
    for r in range(1, 4):
        await store.upsert_many([(p, r, {"r": r}) for p in pids])
    got = await current(store, "horizon", start.offset)
    assert sorted(c.persistence_id for c in got) == sorted(pids)
    assert {c.revision for c in got} == {3}


@pytest.mark.parametrize("mode", MODES)
async def test_live_changes_under_concurrent_upserts_never_go_back(j: Journal, mode: str) -> None:
    """A live query while 5 rounds of upserts and a final delete go over 100 pids: it ends with
    every pid's last change, and per pid the revisions it delivers only grow."""
    store = j.durable_state()
    pids = [f"Cart|{i}" for i in range(100)]
    seen: dict[str, list[int]] = {p: [] for p in pids}
    last: dict[str, StateChange] = {}
    done = asyncio.Event()

    async def follow() -> None:
        async for c in store.changes_by_slices("Cart", 0, 1023, mode=mode):  # type: ignore[arg-type]
            seen[c.persistence_id].append(c.revision)
            last[c.persistence_id] = c
            if all(isinstance(last.get(p), DeletedState) for p in pids):
                done.set()

    task = asyncio.create_task(follow())
    try:
        for r in range(1, 6):
            await store.upsert_many([(p, r, {"r": r}) for p in pids])
            await asyncio.sleep(0)
        for p in pids:
            await store.delete(p, 6)
        await asyncio.wait_for(done.wait(), 30)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    for p in pids:
        assert seen[p] == sorted(set(seen[p])), (p, seen[p])  # increasing, no duplicates
        assert seen[p][-1] == 6


@pytest.mark.parametrize("mode", MODES)
async def test_changes_sharing_a_timestamp_across_pages_keep_their_offsets(dsn: str, mode: str) -> None:
    """Rows as another writer (the JVM plugin) may leave them: several pids at one db_timestamp,
    a delete among them, read in pages of 2 so a page starts inside a timestamp. Each change's
    offset holds every pid delivered at its timestamp up to it, and resuming from any change's
    offset delivers exactly the changes after it."""
    await truncate_all(dsn)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    t1, t2 = t0 + timedelta(microseconds=1), t0 + timedelta(seconds=1)
    rows = [  # (pid, revision, db_timestamp, payload; None: a tombstone), in the query's order
        ("Cart|a", 1, t0, b'{"v": "a"}'), ("Cart|b", 2, t0, b'"b"'), ("Cart|c", 3, t0, None),
        ("Cart|d", 1, t1, b"4"), ("Cart|e", 1, t2, b"[5]"), ("Cart|f", 1, t2, b"null"),
    ]  # fmt: skip
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        await conn.executemany(
            "INSERT INTO durable_state (slice, entity_type, persistence_id, revision, db_timestamp, state_ser_id, "
            "state_ser_manifest, state_payload) VALUES ($1, 'Cart', $2, $3, $4, $5, '', $6)",
            [(slice_for(p), p, r, ts, 1 if b is not None else 0, b or b"") for p, r, ts, b in rows],
        )
    finally:
        await conn.close()
    settings = JournalSettings.load(env={}, dsn=dsn, buffer_size=2, catch_up_buffer_size=2, behind_current_time=0.0)
    async with open_journal(dsn, settings=settings) as journal:
        store = journal.durable_state()
        got = await current(store, mode)
        assert [(type(c), c.persistence_id, c.revision, c.db_timestamp) for c in got] == [
            (UpdatedState if b is not None else DeletedState, p, r, ts) for p, r, ts, b in rows
        ]
        assert [c.value for c in got if isinstance(c, UpdatedState)] == [{"v": "a"}, "b", 4, [5], None]
        assert [(c.offset.timestamp, dict(c.offset.seen)) for c in got] == [
            (t0, {"Cart|a": 1}), (t0, {"Cart|a": 1, "Cart|b": 2}), (t0, {"Cart|a": 1, "Cart|b": 2, "Cart|c": 3}),
            (t1, {"Cart|d": 1}), (t2, {"Cart|e": 1}), (t2, {"Cart|e": 1, "Cart|f": 1}),
        ]  # fmt: skip
        for i, change in enumerate(got):
            assert await current(store, mode, change.offset) == got[i + 1 :], i
