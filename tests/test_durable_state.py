"""Durable state (issue 34) on a real PostgreSQL: revisions, tombstones, upsert_many, the
timestamp rule, bad input refused before I/O, and two concurrent writers."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from journal import (
    DurableState,
    InvalidArgument,
    Journal,
    JournalSettings,
    JournalUnavailable,
    RevisionConflict,
    SerializationError,
    StateWrite,
    StateWritten,
    UnsupportedOperation,
    entity_type_of,
    open_journal,
    slice_for,
)
from journal.envelope import ROW_STEP
from tests.conftest import truncate_all


@pytest.fixture
def store(journal: Journal) -> DurableState:
    return journal.durable_state()


async def raw_row(dsn: str, pid: str) -> asyncpg.Record | None:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchrow("SELECT * FROM durable_state WHERE persistence_id = $1", pid)
    finally:
        await conn.close()


async def test_revisions_go_forward_one_at_a_time(store: DurableState, dsn: str) -> None:
    assert await store.get("Cart|a") is None
    first = await store.upsert("Cart|a", 1, {"items": 1}, tags=["t1"])
    assert first.revision == 1
    got = await store.get("Cart|a")
    assert got is not None and (got.value, got.revision, got.deleted, got.tags) == ({"items": 1}, 1, False, ("t1",))
    second = await store.upsert("Cart|a", 2, {"items": 2})
    assert second.db_timestamp > first.db_timestamp
    for revision, found in ((2, 2), (1, 2), (5, 2)):  # a revision again, the first again, a gap
        with pytest.raises(RevisionConflict) as e:
            await store.upsert("Cart|a", revision, {"items": 99})
        assert (e.value.persistence_id, e.value.revision, e.value.found) == ("Cart|a", revision, found)
        assert f"found stored revision {found}" in str(e.value)
    with pytest.raises(RevisionConflict) as e:
        await store.upsert("Cart|new", 2, {"items": 1})
    assert e.value.found is None
    assert await store.get("Cart|new") is None
    row = await raw_row(dsn, "Cart|a")
    assert row is not None
    assert (row["slice"], row["entity_type"], row["revision"], row["tags"]) == (
        slice_for("Cart|a"), entity_type_of("Cart|a"), 2, None)  # fmt: skip
    assert row["state_ser_id"] == 1 and row["state_payload"] == b'{"items":2}'


async def test_delete_leaves_a_tombstone_and_the_revision_never_goes_back(store: DurableState, dsn: str) -> None:
    await store.upsert("Cart|d", 1, "v1")
    deleted = await store.delete("Cart|d", 2)
    assert deleted.revision == 2
    got = await store.get("Cart|d")
    assert got is not None and (got.value, got.revision, got.deleted) == (None, 2, True)
    row = await raw_row(dsn, "Cart|d")  # the plugin's tombstone: ser id 0, empty payload and manifest
    assert row is not None and (row["state_ser_id"], row["state_ser_manifest"], row["state_payload"]) == (0, "", b"")
    with pytest.raises(RevisionConflict) as e:
        await store.upsert("Cart|d", 1, "again")
    assert e.value.found == 2
    await store.upsert("Cart|d", 3, "v3")
    got = await store.get("Cart|d")
    assert got is not None and (got.value, got.revision, got.deleted) == ("v3", 3, False)
    # a delete of an id never written, at revision 1: a tombstone too (as the plugin)
    await store.delete("Cart|never", 1)
    got = await store.get("Cart|never")
    assert got is not None and got.deleted and got.revision == 1


async def test_hard_delete_removes_the_row(store: DurableState) -> None:
    await store.upsert("Cart|h", 1, "v1")
    await store.upsert("Cart|h", 2, "v2")
    assert await store.hard_delete("Cart|h") is True
    assert await store.get("Cart|h") is None
    assert await store.hard_delete("Cart|h") is False
    assert (await store.upsert("Cart|h", 1, "fresh")).revision == 1


async def test_upsert_many_one_outcome_per_part(store: DurableState) -> None:
    assert await store.upsert_many([]) == []
    await store.upsert("M|old", 1, "o1")
    await store.upsert("M|taken", 1, "t1")
    out = await store.upsert_many(
        [
            StateWrite("M|new", 1, {"n": 1}),
            ("M|old", 2, "o2", ["x"]),
            StateWrite("M|taken", 1, "again"),
            ("M|gap", 3, 1),
        ]
    )
    assert [type(o) for o in out] == [StateWritten, StateWritten, RevisionConflict, RevisionConflict]
    assert isinstance(out[2], RevisionConflict) and out[2].found == 1
    assert isinstance(out[3], RevisionConflict) and out[3].found is None
    written = [o for o in out if isinstance(o, StateWritten)]
    assert [(w.persistence_id, w.revision) for w in written] == [("M|new", 1), ("M|old", 2)]
    # one statement: its rows one microsecond apart (the timestamp rule's per-row step)
    assert written[1].db_timestamp - written[0].db_timestamp == ROW_STEP
    old = await store.get("M|old")
    assert old is not None and (old.value, old.tags) == ("o2", ("x",))
    taken = await store.get("M|taken")
    assert taken is not None and taken.value == "t1"
    assert await store.get("M|gap") is None


async def test_upsert_many_of_plain_parts_is_checked_a_column_at_a_time_and_names_a_failing_part(
    store: DurableState,
) -> None:
    """The commonest bulk call (untagged (pid, revision, value) tuples) takes the columnar path;
    a part that fails any rule there is found again part by part, named, and nothing is written."""
    first = await store.upsert_many([(f"P|{i}", 1, {"i": i}) for i in range(50)])
    assert [(o.persistence_id, o.revision) for o in first if isinstance(o, StateWritten)] == [
        (f"P|{i}", 1) for i in range(50)
    ]
    second = await store.upsert_many([(f"P|{i}", 5 if i == 7 else 2, {"i": i, "r": 2}) for i in range(50)])
    assert [i for i, o in enumerate(second) if isinstance(o, RevisionConflict)] == [7]
    assert isinstance(second[7], RevisionConflict) and second[7].found == 1
    bad: list[tuple[type[Exception], str, list[Any]]] = [
        (SerializationError, "part 3", [(f"P|{i}", 3, (1, 2) if i == 3 else i) for i in range(10)]),
        (SerializationError, "part 2", [(f"P|{i}", 3, float("nan") if i == 2 else i) for i in range(10)]),
        (
            InvalidArgument,
            "part 4: .*two parts",
            [("P|0", 3, 0), *[(f"P|{i}", 3, i) for i in range(1, 4)], ("P|0", 3, 1)],
        ),
        (InvalidArgument, "part 1", [("P|0", 3, 0), ("P|1", True, 1)]),
        (InvalidArgument, "part 1", [("P|0", 3, 0), ("", 3, 1)]),
    ]
    for error, says, parts in bad:
        with pytest.raises(error, match=says):
            await store.upsert_many(parts)
    state = await store.get("P|1")
    assert state is not None and (state.revision, state.value) == (2, {"i": 1, "r": 2})


async def test_upsert_many_of_mixed_entity_types_keeps_each_rows_own(store: DurableState, dsn: str) -> None:
    """Plain parts of one entity type go with it as a single value (upsert_uniform); parts over
    several go as a column: each row keeps its own entity type, its outcome in order."""
    uniform = await store.upsert_many([(f"U|{i}", 1, {"i": i}) for i in range(3)])
    mixed = await store.upsert_many([("U|0", 2, {"i": 0}), ("V|0", 1, "v"), ("W|0", 1, [1])])
    assert [type(o) for o in uniform + mixed] == [StateWritten] * 6
    assert [(o.persistence_id, o.revision) for o in mixed if isinstance(o, StateWritten)] == [
        ("U|0", 2), ("V|0", 1), ("W|0", 1)
    ]  # fmt: skip
    rows = [await raw_row(dsn, pid) for pid in ("U|0", "U|2", "V|0", "W|0")]
    assert [(r["entity_type"], r["revision"]) for r in rows if r] == [("U", 2), ("U", 1), ("V", 1), ("W", 1)]
    got = await store.get("W|0")
    assert got is not None and got.value == [1]


async def test_timestamp_rule_previous_stamp_plus_a_microsecond(store: DurableState, dsn: str) -> None:
    """A row stamped ahead of the clock (a JVM writer's clock, a floor) is followed by prev + 1 µs."""
    await store.upsert("T|a", 1, "v1")
    conn = await asyncpg.connect(dsn)
    try:
        ahead = await conn.fetchval(
            "UPDATE durable_state SET db_timestamp = now() + interval '1 hour' WHERE persistence_id = 'T|a'"
            " RETURNING db_timestamp"
        )
    finally:
        await conn.close()
    written = await store.upsert("T|a", 2, "v2")
    assert written.db_timestamp == ahead + timedelta(microseconds=1)


async def test_bad_input_refused_before_anything_is_sent(dsn: str, settings: JournalSettings) -> None:
    """Each of these raises its typed error on a store whose pool is closed already: had
    anything been sent, the error would be JournalUnavailable."""
    await truncate_all(dsn)
    async with open_journal(dsn, env={}, max_event_bytes=64) as j:
        store = j.durable_state()
    cases: list[tuple[type[Exception], str, object]] = [
        (InvalidArgument, "revision", lambda: store.upsert("B|a", 0, "v")),
        (InvalidArgument, "revision", lambda: store.upsert("B|a", -3, "v")),
        (InvalidArgument, "revision", lambda: store.upsert("B|a", True, "v")),
        (InvalidArgument, "revision", lambda: store.delete("B|a", 0)),
        (InvalidArgument, "persistence id", lambda: store.upsert("", 1, "v")),
        (InvalidArgument, "max_event_bytes", lambda: store.upsert("B|a", 1, "x" * 100)),
        (SerializationError, "object", lambda: store.upsert("B|a", 1, object())),
        (InvalidArgument, "part 1: .*two parts", lambda: store.upsert_many([("B|a", 1, "v"), ("B|a", 2, "w")])),
        (SerializationError, "part 1", lambda: store.upsert_many([("B|a", 1, "v"), ("B|b", 1, object())])),
        (InvalidArgument, "part 0", lambda: store.upsert_many([("B|a", 0, "v")])),
        (InvalidArgument, "part 0", lambda: store.upsert_many(["B|a"])),
    ]
    for error, match, call in cases:
        with pytest.raises(error, match=match):
            await call()  # type: ignore[operator]
    with pytest.raises(JournalUnavailable):  # the check is not vacuous: a valid call goes out
        await store.upsert("B|a", 1, "v")
    assert await raw_row(dsn, "B|a") is None


async def test_two_concurrent_writers_exactly_one_wins_each_revision(dsn: str, settings: JournalSettings) -> None:
    """Two journals (two pools) write revisions 1..5 of the same 100 ids at once, one by upsert,
    one by upsert_many: each (id, revision) is won by exactly one, the loser gets a conflict
    naming a revision at or past it, and the stored value is the winner's of revision 5."""
    await truncate_all(dsn)
    ids = [f"Race|{i}" for i in range(100)]
    revisions = range(1, 6)
    wins: dict[tuple[str, int], list[str]] = {}

    def won(who: str, pid: str, revision: int) -> None:
        wins.setdefault((pid, revision), []).append(who)

    async def single(store: DurableState) -> None:
        async def one(pid: str) -> None:
            for r in revisions:
                try:
                    await store.upsert(pid, r, {"by": "single", "r": r})
                    won("single", pid, r)
                except RevisionConflict as e:
                    assert e.found is not None and e.found >= r
                await asyncio.sleep(0)

        await asyncio.gather(*(one(p) for p in ids))

    async def many(store: DurableState) -> None:
        order = random.Random(34)
        for r in revisions:
            chunk = order.sample(ids, len(ids))
            for part in (chunk[k : k + 10] for k in range(0, len(chunk), 10)):
                outcomes = await store.upsert_many([(p, r, {"by": "many", "r": r}) for p in part])
                for pid, o in zip(part, outcomes, strict=True):
                    if isinstance(o, StateWritten):
                        won("many", pid, r)
                    else:
                        assert isinstance(o, RevisionConflict) and o.found is not None and o.found >= r

    async with open_journal(dsn, settings=settings) as a, open_journal(dsn, settings=settings) as b:
        await asyncio.gather(single(a.durable_state()), many(b.durable_state()))
        store = a.durable_state()
        assert sorted(wins) == sorted((p, r) for p in ids for r in revisions)
        assert all(len(w) == 1 for w in wins.values()), {k: w for k, w in wins.items() if len(w) > 1}
        assert {w[0] for w in wins.values()} == {"single", "many"}  # both won some: they raced
        for pid in ids:
            got = await store.get(pid)
            assert got is not None and got.revision == 5 and got.value == {"by": wins[pid, 5][0], "r": 5}


async def test_durable_state_needs_postgresql() -> None:
    from journal.cassandra.backend import CassandraBackend
    from journal.tags.writer import TagWriters

    settings = JournalSettings.load(env={})
    backend = CassandraBackend(["127.0.0.1"], 9042, "ks", settings, lambda s: TagWriters(s, settings.tags))
    with pytest.raises(UnsupportedOperation, match="durable state needs PostgreSQL"):
        Journal(backend, settings).durable_state()
