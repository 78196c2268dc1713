"""Durable state (issue 34): change handlers and change events in the upsert's transaction."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from journal import (
    DeletedState,
    Journal,
    RevisionConflict,
    SequenceConflict,
    StateChange,
    StateWritten,
    UpdatedState,
    open_journal,
)
from journal.ids import slice_for
from tests.conftest import truncate_all


@pytest.fixture
async def view(dsn: str) -> AsyncIterator[str]:
    """A query model table the handlers write (in the upsert's transaction)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS cart_view (pid text PRIMARY KEY, revision bigint, items int)")
        await conn.execute("TRUNCATE cart_view")
        yield dsn
    finally:
        await conn.execute("DROP TABLE IF EXISTS cart_view")
        await conn.close()


async def view_rows(dsn: str) -> dict[str, tuple[int, int | None]]:
    conn = await asyncpg.connect(dsn)
    try:
        return {r["pid"]: (r["revision"], r["items"]) for r in await conn.fetch("SELECT * FROM cart_view")}
    finally:
        await conn.close()


async def to_view(conn: Any, change: StateChange) -> None:
    items = change.value["items"] if isinstance(change, UpdatedState) else None
    await conn.execute(
        "INSERT INTO cart_view VALUES ($1, $2, $3) ON CONFLICT (pid) DO UPDATE SET revision = $2, items = $3",
        change.persistence_id, change.revision, items,
    )  # fmt: skip


async def test_handler_in_the_upserts_transaction_never_for_a_refused_revision(journal: Journal, view: str) -> None:
    store = journal.durable_state()
    calls: list[tuple[str, int, str]] = []

    async def record(conn: Any, change: StateChange) -> None:
        assert conn.is_in_transaction()
        calls.append((change.persistence_id, change.revision, type(change).__name__))

    store.add_change_handler("Cart", to_view)
    store.add_change_handler("Cart", record)
    await store.upsert("Cart|a", 1, {"items": 1})
    await store.upsert("Other|x", 1, {"items": 7})  # another entity type: no handler
    with pytest.raises(RevisionConflict):
        await store.upsert("Cart|a", 1, {"items": 9})
    out = await store.upsert_many(
        [("Cart|a", 2, {"items": 2}), ("Cart|b", 2, {"items": 5}), ("Cart|c", 1, {"items": 3})]
    )
    assert [type(o) for o in out] == [StateWritten, RevisionConflict, StateWritten]
    await store.delete("Cart|c", 2)
    assert calls == [("Cart|a", 1, "UpdatedState"), ("Cart|a", 2, "UpdatedState"), ("Cart|c", 1, "UpdatedState"),
                     ("Cart|c", 2, "DeletedState")]  # fmt: skip
    assert await view_rows(view) == {"Cart|a": (2, 2), "Cart|c": (2, None)}


async def test_a_failing_handler_rolls_the_upsert_back(journal: Journal, view: str) -> None:
    store = journal.durable_state()
    store.add_change_handler("Cart", to_view)

    async def refuse_big(conn: Any, change: StateChange) -> None:
        if isinstance(change, UpdatedState) and change.value["items"] > 10:
            raise ValueError("too many items")

    store.add_change_handler("Cart", refuse_big)
    await store.upsert("Cart|a", 1, {"items": 1})
    with pytest.raises(ValueError, match="too many items"):
        await store.upsert_many([("Cart|b", 1, {"items": 2}), ("Cart|a", 2, {"items": 11})])
    got = await store.get("Cart|a")
    assert got is not None and got.revision == 1
    assert await store.get("Cart|b") is None  # the whole statement rolled back
    assert await view_rows(view) == {"Cart|a": (1, 1)}


async def test_change_events_in_the_journal_with_the_revision_as_seq_nr(journal: Journal) -> None:
    store = journal.durable_state()

    def to_event(change: StateChange) -> dict[str, Any]:
        if isinstance(change, DeletedState):
            return {"deleted": True}
        return {"state": change.value}

    store.write_change_events("Cart", to_event)
    for r in range(1, 4):
        await store.upsert("Cart|e", r, {"items": r})
    with pytest.raises(RevisionConflict):
        await store.upsert("Cart|e", 2, {"items": 99})
    await store.delete("Cart|e", 4)
    events = [(e.seq_nr, e.event) async for e in journal.current_events_by_persistence_id("Cart|e")]
    assert events == [(1, {"state": {"items": 1}}), (2, {"state": {"items": 2}}), (3, {"state": {"items": 3}}),
                      (4, {"deleted": True})]  # fmt: skip
    # every change: a plain events-by-slices query
    s = slice_for("Cart|e")
    assert [e.seq_nr async for e in journal.current_events_by_slices("Cart", s, s)] == [1, 2, 3, 4]
    # a pid whose events do not follow its revisions: the event conflicts, nothing written
    await journal.persist("Cart|f", ["an event of its own"])
    with pytest.raises(SequenceConflict):
        await store.upsert("Cart|f", 1, {"items": 1})
    assert await store.get("Cart|f") is None


async def test_concurrent_writers_each_change_handled_once(dsn: str, view: str) -> None:
    """Two journals racing on the same ids with the same handler: one call per revision won."""
    await truncate_all(dsn)
    ids = [f"Cart|{i}" for i in range(50)]
    handled: list[tuple[str, int]] = []

    async def count(conn: Any, change: StateChange) -> None:
        handled.append((change.persistence_id, change.revision))

    async def writer(j: Journal) -> int:
        store = j.durable_state()
        store.add_change_handler("Cart", count)
        store.add_change_handler("Cart", to_view)
        won = 0
        for r in range(1, 4):
            for o in await asyncio.gather(*(store.upsert_many([(p, r, {"items": r})]) for p in ids)):
                won += isinstance(o[0], StateWritten)
        return won

    async with open_journal(dsn, env={}) as a, open_journal(dsn, env={}) as b:
        wins = await asyncio.gather(writer(a), writer(b))
    assert sum(wins) == len(ids) * 3
    assert sorted(handled) == sorted((p, r) for p in ids for r in range(1, 4))
    assert await view_rows(view) == {p: (3, 3) for p in ids}
