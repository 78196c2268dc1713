"""Durable state (issue 34): additional columns, written in the upsert's transaction, in columns
added to durable_state or in a table of their own; bad configuration refused when registered.

A database of its own (a scratch one on the test server): its durable_state gets columns that
the other tests' tables do not have.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from journal import (
    SKIP,
    AdditionalColumn,
    ConfigurationError,
    DeletedState,
    Journal,
    RevisionConflict,
    StateChange,
    StateWrite,
    StateWritten,
    UpdatedState,
    open_journal,
)
from journal.postgres import asyncpg_dsn, schema_migrations
from tests.conftest import truncate_all
from tests.support.scratch import scratch_database


@pytest.fixture(scope="module")
def columns_dsn(server_dsn: str) -> Iterator[str]:
    with scratch_database(server_dsn, "sjcols") as d:
        schema_migrations().upgrade(d)
        yield d


@pytest.fixture
async def carts(columns_dsn: str) -> AsyncIterator[Journal]:
    conn = await asyncpg.connect(asyncpg_dsn(columns_dsn))
    try:
        await conn.execute("ALTER TABLE durable_state ADD COLUMN IF NOT EXISTS total int")
        await conn.execute("ALTER TABLE durable_state ADD COLUMN IF NOT EXISTS owner text")
        await conn.execute("CREATE TABLE IF NOT EXISTS cart_items (persistence_id text PRIMARY KEY, items int)")
        await conn.execute("CREATE TABLE IF NOT EXISTS no_key (persistence_id text, items int)")
        await conn.execute("TRUNCATE cart_items")
    finally:
        await conn.close()
    await truncate_all(columns_dsn)
    async with open_journal(columns_dsn) as j:
        yield j


def total(change: StateChange) -> Any:
    return sum(change.value["items"].values()) if isinstance(change, UpdatedState) else None


def owner(change: StateChange) -> Any:
    if isinstance(change, DeletedState):
        return SKIP  # the owner stays on a deleted cart
    return change.value.get("owner", SKIP)


def items(change: StateChange) -> Any:
    return len(change.value["items"]) if isinstance(change, UpdatedState) else 0


COLUMNS = (
    AdditionalColumn("Cart", "total", total),
    AdditionalColumn("Cart", "owner", owner),
    AdditionalColumn("Cart", "items", items, table="cart_items"),
)


async def columns(dsn: str) -> dict[str, tuple[Any, ...]]:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        rows = await conn.fetch(
            "SELECT d.persistence_id, d.revision, d.total, d.owner, c.items FROM durable_state d "
            "LEFT JOIN cart_items c USING (persistence_id)"
        )
        return {r[0]: tuple(r[1:]) for r in rows}
    finally:
        await conn.close()


async def test_columns_are_written_with_their_state(carts: Journal, columns_dsn: str) -> None:
    """Before: there was no way to write a column of the state's row or a table beside it."""
    store = carts.durable_state()
    await store.add_columns(*COLUMNS)
    await store.upsert("Cart|a", 1, {"items": {"apple": 2, "pear": 1}, "owner": "ann"})
    await store.upsert("Other|x", 1, {"items": {"x": 1}})  # another entity type: no columns
    assert await columns(columns_dsn) == {"Cart|a": (1, 3, "ann", 2), "Other|x": (1, None, None, None)}
    await store.upsert("Cart|a", 2, {"items": {"apple": 5}})  # no owner: skipped, it stays
    outcomes = await store.upsert_many(
        [StateWrite("Cart|b", 1, {"items": {"fig": 4}, "owner": "bob"}), StateWrite("Cart|a", 2, {"items": {}})]
    )
    assert isinstance(outcomes[0], StateWritten) and isinstance(outcomes[1], RevisionConflict)
    assert (await columns(columns_dsn))["Cart|a"] == (2, 5, "ann", 1)  # the refused part changed nothing
    assert (await columns(columns_dsn))["Cart|b"] == (1, 4, "bob", 1)
    await store.delete("Cart|a", 3)
    assert (await columns(columns_dsn))["Cart|a"] == (3, None, "ann", 0)


async def test_a_failing_handler_rolls_the_columns_back(carts: Journal, columns_dsn: str) -> None:
    store = carts.durable_state()
    await store.add_columns(*COLUMNS)
    await store.upsert("Cart|c", 1, {"items": {"kiwi": 1}, "owner": "cy"})

    async def refuse(conn: Any, change: StateChange) -> None:
        raise RuntimeError("the view refused it")

    store.add_change_handler("Cart", refuse)
    with pytest.raises(RuntimeError, match="the view refused it"):
        await store.upsert("Cart|c", 2, {"items": {"kiwi": 9}, "owner": "dee"})
    assert (await columns(columns_dsn))["Cart|c"] == (1, 1, "cy", 1)


@pytest.mark.parametrize(
    ("column", "said"),
    [
        (AdditionalColumn("Cart", "missing", total), "durable_state has no column 'missing'"),
        (AdditionalColumn("Cart", "items", items, table="no_table"), "no table public.no_table"),
        (AdditionalColumn("Cart", "items", items, table="no_key"), "needs persistence_id as its primary key"),
        (AdditionalColumn("Cart", "revision", total), "a column of the plugin's durable_state"),
        (AdditionalColumn("Cart", "bad name", total), "is not a valid identifier"),
        (AdditionalColumn("Cart|x", "total", total), "entity type"),
    ],
)
async def test_bad_columns_are_refused_when_added(carts: Journal, column: AdditionalColumn, said: str) -> None:
    store = carts.durable_state()
    with pytest.raises(ConfigurationError, match=said):
        await store.add_columns(AdditionalColumn("Cart", "total", total), column)
    await store.upsert("Cart|d", 1, {"items": {"plum": 1}})  # none of the call was added
    got = await store.get("Cart|d")
    assert got is not None and got.revision == 1
