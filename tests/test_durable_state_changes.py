"""Changes by slices of the durable state (issue 34) on a real PostgreSQL: the latest revision of
every changed pid, deletes as their own kind, offsets, live queries in both modes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

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
)
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
