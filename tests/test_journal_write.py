"""Write and replay against a real PostgreSQL: atomicity, conflicts, timestamps, deletes, snapshots."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import re
from datetime import UTC, datetime

import asyncpg
import pytest

from journal import (
    InvalidArgument,
    Journal,
    JournalSettings,
    SequenceConflict,
    SerializationError,
    StorageError,
    open_journal,
    slice_for,
)
from journal.envelope import ROW_STEP
from journal.offsets import SequenceOffset
from tests.support.rows import count_rows


async def events_of(j: Journal, pid: str, **kw: int) -> list[object]:
    return [e.event async for e in j.current_events_by_persistence_id(pid, **kw)]


async def test_round_trip_with_everything(journal: Journal) -> None:
    envs = await journal.persist("cart|a", [{"n": 1}, {"n": 2}], tags=["t1", "t2"], metadata={"by": "me"})
    assert [e.seq_nr for e in envs] == [1, 2]
    assert envs[1].db_timestamp - envs[0].db_timestamp == ROW_STEP  # one call: consecutive microseconds
    assert envs[0].db_timestamp.tzinfo is not None
    assert envs[0].slice == slice_for("cart|a") and envs[0].entity_type == "cart"
    more = await journal.persist("cart|a", [b"raw"], expected_seq_nr=2)
    assert more[0].seq_nr == 3 and more[0].offset == SequenceOffset(3)
    stored = [e async for e in journal.current_events_by_persistence_id("cart|a")]
    assert [e.event for e in stored] == [{"n": 1}, {"n": 2}, b"raw"]
    assert stored[0].tags == ("t1", "t2") and stored[0].metadata == {"by": "me"}
    assert stored[2].tags == () and stored[2].metadata is None
    assert stored[0].writer == journal.writer_id
    assert [e.db_timestamp for e in stored[:2]] == [e.db_timestamp for e in envs]
    assert await journal.highest_seq_nr("cart|a") == 3
    assert await journal.highest_seq_nr("cart|none") == 0
    assert await events_of(journal, "cart|a", from_seq_nr=2, to_seq_nr=2) == [{"n": 2}]


async def test_paging(dsn: str, journal: Journal) -> None:
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn, buffer_size=7)) as j:
        for k in range(5):
            await j.persist("p|1", [{"i": k * 10 + i} for i in range(10)])
        got = await events_of(j, "p|1")
        assert got == [{"i": i} for i in range(50)]
        assert await events_of(j, "p|1", from_seq_nr=45) == [{"i": i} for i in range(44, 50)]


async def test_expected_seq_nr_must_match(journal: Journal) -> None:
    await journal.persist("c|1", [1, 2])
    for wrong in (0, 1, 3, 10):
        with pytest.raises(SequenceConflict) as err:
            await journal.persist("c|1", ["x"], expected_seq_nr=wrong)
        assert err.value.persistence_id == "c|1" and err.value.expected_seq_nr == wrong
    assert await events_of(journal, "c|1") == [1, 2]


async def test_conflict_under_real_concurrency(dsn: str, journal: Journal, settings: JournalSettings) -> None:
    """Many writers (separate journals, separate connections) race for the same numbers of one pid."""
    async with contextlib.AsyncExitStack() as stack:
        journals = [await stack.enter_async_context(open_journal(dsn, settings=settings)) for _ in range(6)]
        winners = 0
        for round_ in range(10):
            results = await asyncio.gather(
                *(j.persist("race|1", [f"{round_}-{k}-a", f"{round_}-{k}-b"], expected_seq_nr=round_ * 2)
                  for k, j in enumerate(journals)),
                return_exceptions=True,
            )  # fmt: skip
            ok = [r for r in results if not isinstance(r, BaseException)]
            bad = [r for r in results if isinstance(r, BaseException)]
            assert len(ok) == 1, results
            assert all(isinstance(b, SequenceConflict) for b in bad), bad
            winners += 1
        stored = await events_of(journal, "race|1")
        assert len(stored) == 20
        # each round's two events come from one writer: nothing of a losing call was written
        for r in range(10):
            a, b = stored[2 * r], stored[2 * r + 1]
            assert isinstance(a, str) and isinstance(b, str)
            assert a.rsplit("-", 1)[0] == b.rsplit("-", 1)[0]


async def test_conflict_fails_only_that_call_in_a_group_commit(journal: Journal) -> None:
    await journal.persist("g|taken", ["x"])
    calls = [journal.persist(f"g|{i}", [i]) for i in range(50)]
    calls.append(journal.persist("g|taken", ["y"], expected_seq_nr=0))
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[-1], SequenceConflict)
    assert all(isinstance(r, list) for r in results[:-1])
    assert await events_of(journal, "g|taken") == ["x"]
    assert await events_of(journal, "g|7") == [7]


async def test_group_commit_coalesces(journal: Journal) -> None:
    gc = journal._group_commit
    before_batches, before_calls = gc.batches_written, gc.calls_written
    await asyncio.gather(*(journal.persist(f"gc|{i}", [i, i]) for i in range(300)))
    calls = gc.calls_written - before_calls
    batches = gc.batches_written - before_batches
    assert calls == 300
    assert batches < 30, f"{batches} batches for 300 concurrent calls"


async def test_same_pid_calls_keep_their_order(journal: Journal) -> None:
    results = await asyncio.gather(*(journal.persist("order|1", [i]) for i in range(40)))
    assert [r[0].seq_nr for r in results] == list(range(1, 41))
    assert await events_of(journal, "order|1") == list(range(40))


async def test_db_timestamp_is_monotonic_per_pid_under_concurrency(dsn: str, settings: JournalSettings) -> None:
    async with open_journal(dsn, settings=settings) as j1, open_journal(dsn, settings=settings) as j2:

        async def writer(j: Journal, tag: str) -> None:
            for i in range(60):
                while True:
                    try:
                        await j.persist("mono|1", [f"{tag}{i}"], expected_seq_nr=await j.highest_seq_nr("mono|1"))
                        break
                    except SequenceConflict:
                        continue

        await asyncio.gather(writer(j1, "a"), writer(j2, "b"), *(j1.persist(f"other|{i}", [i]) for i in range(100)))
        envs = [e async for e in j1.current_events_by_persistence_id("mono|1")]
        assert [e.seq_nr for e in envs] == list(range(1, 121))
        stamps = [e.db_timestamp for e in envs]
        assert all(a < b for a, b in itertools.pairwise(stamps)), "db_timestamp went backwards"


async def test_timestamp_comes_from_the_clock_not_the_transaction_start(dsn: str, journal: Journal) -> None:
    """The write rule the horizon relies on: db_timestamp is taken while the insert executes."""
    before = datetime.now(UTC)
    envs = await journal.persist("clock|1", ["x"])
    after = datetime.now(UTC)
    assert before.timestamp() - 1 <= envs[0].db_timestamp.timestamp() <= after.timestamp() + 1
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            start = await conn.fetchval("SELECT transaction_timestamp()")
            await asyncio.sleep(0.3)  # the thing under test: the transaction is 0.3 s old at the insert
            envs = await journal.persist_in(conn, "clock|2", ["y"])
        assert (envs[0].db_timestamp - start).total_seconds() >= 0.3
    finally:
        await conn.close()


async def test_persist_in_the_callers_transaction(dsn: str, journal: Journal) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE TEMP TABLE outbox (msg text)")
        async with conn.transaction():
            envs = await journal.persist_in(conn, "tx|1", ["a", "b"], tags=["t"])
            await conn.execute("INSERT INTO outbox VALUES ('sent a and b')")
        assert [e.seq_nr for e in envs] == [1, 2]
        tr = conn.transaction()
        await tr.start()
        await journal.persist_in(conn, "tx|1", ["c"], expected_seq_nr=2)
        await tr.rollback()  # nothing of it stays
        with pytest.raises(SequenceConflict):
            async with conn.transaction():
                await journal.persist_in(conn, "tx|1", ["x"], expected_seq_nr=5)
        assert await conn.fetchval("SELECT count(*) FROM outbox") == 1
    finally:
        await conn.close()
    assert await events_of(journal, "tx|1") == ["a", "b"]


async def test_serialization_failure_writes_nothing(dsn: str, journal: Journal) -> None:
    with pytest.raises(SerializationError, match=re.escape("event 1 of 'ser|1'")):
        await journal.persist("ser|1", [{"ok": 1}, object()])
    with pytest.raises(SerializationError, match="metadata"):
        await journal.persist("ser|1", [{"ok": 1}], metadata=object())
    assert await count_rows(dsn, "ser|1") == 0


@pytest.mark.parametrize(
    ("pid", "events", "kwargs", "match"),
    [
        ("", [1], {}, "must not be empty"),
        ("x" * 256, [1], {}, "the limit is 255"),
        ("a\x00b", [1], {}, "NUL"),
        (42, [1], {}, "must be a str"),
        ("ok|1", [], {}, "at least one event"),
        ("ok|1", {"not": "a list"}, {}, "list or tuple"),
        ("ok|1", "abc", {}, "list or tuple"),
        ("ok|1", [1], {"expected_seq_nr": -1}, ">= 0"),
        ("ok|1", [1], {"expected_seq_nr": "3"}, "must be an int"),
        ("ok|1", [1], {"tags": "single"}, "not a single string"),
        ("ok|1", [1], {"tags": [1]}, "tag must be a str"),
        ("ok|1", [1], {"tags": ["  "]}, "tag must not be blank"),
        ("ok|1", [1], {"tags": ["t" * 256]}, "the limit is 255"),
    ],
)
async def test_bad_input_is_refused_before_io(
    dsn: str, journal: Journal, pid: object, events: object, kwargs: dict[str, object], match: str
) -> None:
    with pytest.raises(InvalidArgument, match=match):
        await journal.persist(pid, events, **kwargs)  # type: ignore[arg-type]
    assert await count_rows(dsn) == 0


async def test_bad_input_on_reads(journal: Journal) -> None:
    with pytest.raises(InvalidArgument):
        await journal.highest_seq_nr("")
    with pytest.raises(InvalidArgument):
        [e async for e in journal.current_events_by_persistence_id("p|1", from_seq_nr=-1)]
    with pytest.raises(InvalidArgument):
        await journal.delete_events_to("p|1", -5)
    with pytest.raises(InvalidArgument):
        [p async for p in journal.current_persistence_ids("a|b")]


async def test_a_poisoned_call_fails_alone(dsn: str, journal: Journal) -> None:
    """Injected failure: a trigger rejects one call's second event mid-statement."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """CREATE FUNCTION reject_poison() RETURNS trigger AS $$
               BEGIN IF NEW.persistence_id = 'poison|1' AND NEW.seq_nr = 2 THEN
                 RAISE EXCEPTION 'injected failure'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql;
               CREATE TRIGGER poison BEFORE INSERT ON event_journal
                 FOR EACH ROW EXECUTE FUNCTION reject_poison();"""
        )
        calls = [journal.persist(f"fine|{i}", [i]) for i in range(20)]
        calls.append(journal.persist("poison|1", ["a", "b", "c"]))
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(results[-1], StorageError) and "injected failure" in str(results[-1])
        assert all(isinstance(r, list) for r in results[:-1])
        assert await count_rows(dsn, "poison|1") == 0
        assert await count_rows(dsn) == 20
    finally:
        await conn.execute("DROP TRIGGER IF EXISTS poison ON event_journal; DROP FUNCTION IF EXISTS reject_poison()")
        await conn.close()


async def test_delete_keeps_the_highest_sequence_number(dsn: str, journal: Journal) -> None:
    await journal.persist("del|1", list(range(10)))
    await journal.delete_events_to("del|1", 4)
    assert await events_of(journal, "del|1") == list(range(4, 10))
    assert await journal.highest_seq_nr("del|1") == 10
    await journal.delete_events_to("del|1", 100)  # beyond the highest: clamps
    assert await events_of(journal, "del|1") == []
    assert await journal.highest_seq_nr("del|1") == 10
    assert await count_rows(dsn, "del|1") == 1  # the tombstone
    envs = await journal.persist("del|1", ["after"], expected_seq_nr=10)
    assert envs[0].seq_nr == 11
    assert await events_of(journal, "del|1") == ["after"]
    await journal.delete_events_to("nobody|1", 5)  # nothing to delete is fine
    assert await journal.highest_seq_nr("nobody|1") == 0


async def test_persistence_ids(journal: Journal) -> None:
    await asyncio.gather(*(journal.persist(f"a|{i:03}", [i]) for i in range(30)))
    await asyncio.gather(*(journal.persist(f"b|{i:03}", [i]) for i in range(5)))
    await journal.persist("a|000", ["again"])
    every = [p async for p in journal.current_persistence_ids()]
    assert len(every) == 35 and every == sorted(every)
    assert [p async for p in journal.current_persistence_ids("b")] == [f"b|{i:03}" for i in range(5)]
    assert [p async for p in journal.current_persistence_ids("zzz")] == []


@dataclasses.dataclass
class CartState:
    items: list[str]


async def test_snapshots_replace_load_delete(journal: Journal) -> None:
    assert await journal.load_snapshot("s|1") is None
    await journal.save_snapshot("s|1", 5, CartState(["a"]), tags=["x"], metadata={"v": 1})
    journal.serializers.register_type(CartState)
    snap = await journal.load_snapshot("s|1")
    assert snap is not None and snap.seq_nr == 5 and snap.state == CartState(["a"])
    assert snap.tags == ("x",) and snap.metadata == {"v": 1}
    await journal.save_snapshot("s|1", 9, CartState(["a", "b"]))
    snap = await journal.load_snapshot("s|1")
    assert snap is not None and snap.seq_nr == 9 and snap.state.items == ["a", "b"] and snap.metadata is None
    await journal.delete_snapshot("s|1")
    assert await journal.load_snapshot("s|1") is None
    with pytest.raises(SerializationError):
        await journal.save_snapshot("s|1", 1, object())
