"""persist_many against a real PostgreSQL: per-part atomicity and conflicts, bad input writes
nothing, ordering, and its interplay with concurrent group-committed persist calls."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import asyncpg
import pytest

from journal import (
    InvalidArgument,
    Journal,
    JournalSettings,
    SequenceConflict,
    SerializationError,
    StorageError,
    Write,
    Written,
    failures,
    open_journal,
)
from journal.ids import entity_type_of, slice_for
from tests.support.rows import count_rows


async def events_of(j: Journal, pid: str) -> list[object]:
    return [e.event async for e in j.current_events_by_persistence_id(pid)]


async def test_every_part_written_with_its_numbers_tags_and_metadata(journal: Journal) -> None:
    await journal.persist("acc|b", ["old"])
    out = await journal.persist_many(
        [
            Write("acc|a", [{"n": 1}, {"n": 2}]),
            Write("acc|b", [{"n": 3}], expected_seq_nr=1, tags=["t"], metadata={"by": "bulk"}),
            ("acc|c", [b"raw"], 0),  # a plain tuple works too
        ]
    )
    assert [type(o) for o in out] == [Written, Written, Written]
    a, b, c = out
    assert isinstance(a, Written) and isinstance(b, Written) and isinstance(c, Written)
    assert (a.persistence_id, a.first_seq_nr, a.last_seq_nr) == ("acc|a", 1, 2)
    assert (b.first_seq_nr, b.last_seq_nr) == (2, 2)
    assert (c.first_seq_nr, c.last_seq_nr) == (1, 1)
    assert await events_of(journal, "acc|a") == [{"n": 1}, {"n": 2}]
    stored_b = [e async for e in journal.current_events_by_persistence_id("acc|b")]
    assert [e.event for e in stored_b] == ["old", {"n": 3}]
    assert stored_b[1].tags == ("t",) and stored_b[1].metadata == {"by": "bulk"}
    assert stored_b[1].db_timestamp == b.db_timestamp  # the first event of the part
    assert await events_of(journal, "acc|c") == [b"raw"]
    assert failures(out) == []


async def test_a_conflicting_part_fails_alone_and_writes_nothing(dsn: str, journal: Journal) -> None:
    await journal.persist("k|taken", [1, 2, 3])
    out = await journal.persist_many(
        [Write(f"k|{i}", [i, i], expected_seq_nr=0) for i in range(10)]
        + [Write("k|taken", ["x", "y"], expected_seq_nr=1)]  # stale: 3 are stored
        + [Write("k|ahead", ["z"], expected_seq_nr=5)]  # gap: nothing is stored
    )
    failed = failures(out)
    assert [i for i, _ in failed] == [10, 11]
    assert all(isinstance(e, SequenceConflict) for _, e in failed)
    assert isinstance(failed[0][1], SequenceConflict) and failed[0][1].persistence_id == "k|taken"
    assert all(isinstance(o, Written) and o.first_seq_nr == 1 and o.last_seq_nr == 2 for o in out[:10])
    assert await events_of(journal, "k|taken") == [1, 2, 3]
    assert await count_rows(dsn, "k|ahead") == 0
    assert await count_rows(dsn) == 3 + 20


async def test_a_poisoned_part_fails_alone_atomically(dsn: str, journal: Journal) -> None:
    """Injected failure: a trigger rejects one part's second event in the middle of the statement."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """CREATE FUNCTION reject_bulk_poison() RETURNS trigger AS $$
               BEGIN IF NEW.persistence_id = 'bp|poison' AND NEW.seq_nr = 2 THEN
                 RAISE EXCEPTION 'injected failure'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql;
               CREATE TRIGGER bulk_poison BEFORE INSERT ON event_journal
                 FOR EACH ROW EXECUTE FUNCTION reject_bulk_poison();"""
        )
        writes = [Write(f"bp|{i}", [i]) for i in range(30)]
        writes.insert(7, Write("bp|poison", ["a", "b", "c"]))
        out = await journal.persist_many(writes)
        assert [i for i, _ in failures(out)] == [7]
        assert isinstance(out[7], StorageError) and "injected failure" in str(out[7])
        assert await count_rows(dsn, "bp|poison") == 0
        assert await count_rows(dsn) == 30
    finally:
        await conn.execute(
            "DROP TRIGGER IF EXISTS bulk_poison ON event_journal; DROP FUNCTION IF EXISTS reject_bulk_poison()"
        )
        await conn.close()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (Write("", [1]), "persistence id must not be empty"),
        (Write("b|1", []), "at least one event"),
        (Write("b|1", "abc"), "list or tuple"),
        (Write("b|1", [1], expected_seq_nr=-1), "expected_seq_nr"),
        (Write("b|1", [1], tags="t"), "single string"),
        (("b|1",), "Write or a"),
        ("b|1", "Write or a"),
        (Write("b|0", [1]), "appears in an earlier part"),
    ],
)
async def test_bad_input_raises_before_anything_is_written(
    dsn: str, journal: Journal, bad: object, message: str
) -> None:
    writes: list[object] = [Write(f"b|{i}", [i]) for i in range(5)] + [bad] + [Write("b|last", [1])]
    with pytest.raises(InvalidArgument, match=message) as err:
        await journal.persist_many(writes)  # type: ignore[arg-type]
    assert "part 5" in str(err.value)
    assert await count_rows(dsn) == 0


async def test_an_unserializable_event_raises_before_anything_is_written(dsn: str, journal: Journal) -> None:
    with pytest.raises(SerializationError, match="part 2"):
        await journal.persist_many([Write("s|0", [0]), Write("s|1", [1]), Write("s|2", [object()])])
    assert await count_rows(dsn) == 0


async def test_empty_input_does_nothing(journal: Journal) -> None:
    assert await journal.persist_many([]) == []


async def test_large_bulk_is_split_into_statements_and_keeps_the_input_order(dsn: str) -> None:
    settings = JournalSettings.load(env={}, dsn=dsn, max_batch_events=100)
    from tests.conftest import truncate_all

    await truncate_all(dsn)
    async with open_journal(dsn, settings=settings) as j:
        writes = [Write(f"big|{i}", [i] * (1 + i % 3)) for i in range(1000)]
        writes.append(Write("big|huge", list(range(250))))  # larger than a batch: goes alone
        before = j._group_commit.batches_written
        out = await j.persist_many(writes)
        assert failures(out) == []
        assert [o.persistence_id for o in out if isinstance(o, Written)] == [w.persistence_id for w in writes]
        assert all(
            isinstance(o, Written) and o.last_seq_nr - o.first_seq_nr + 1 == len(w.events)
            for o, w in zip(out, writes, strict=True)
        )
        assert j._group_commit.batches_written - before >= 20  # about 2,000 events / 100
        assert await count_rows(dsn) == sum(len(w.events) for w in writes)
        # a second round on the same pids continues their numbering
        again = await j.persist_many([Write(w.persistence_id, ["next"], len(w.events)) for w in writes[:50]])
        assert failures(again) == []
        assert await events_of(j, "big|4") == [4, 4, "next"]


async def test_interleaves_with_concurrent_persist_calls_in_order_per_pid(dsn: str) -> None:
    """Concurrent persist() calls on the same pids as a running bulk write: per pid, every event
    lands exactly once, numbered without gaps, and each writer's own events stay in its order."""
    settings = JournalSettings.load(env={}, dsn=dsn, max_batch_events=50)
    from tests.conftest import truncate_all

    await truncate_all(dsn)
    pids = [f"mix|{i}" for i in range(40)]
    async with open_journal(dsn, settings=settings) as j:

        async def single_writer(pid: str) -> None:
            for k in range(5):
                await j.persist(pid, [f"s{k}"])

        async def bulk_writer(round_: int) -> list[object]:
            return list(await j.persist_many([Write(p, [f"b{round_}a", f"b{round_}b"]) for p in pids]))

        results = await asyncio.gather(
            *(single_writer(p) for p in pids), bulk_writer(0), bulk_writer(1), bulk_writer(2)
        )
        for out in results[len(pids) :]:
            assert isinstance(out, list) and failures(out) == []  # type: ignore[arg-type]
        for p in pids:
            got = [e async for e in j.current_events_by_persistence_id(p)]
            assert [e.seq_nr for e in got] == list(range(1, 5 + 3 * 2 + 1))
            events = [e.event for e in got]
            assert [e for e in events if str(e).startswith("s")] == [f"s{k}" for k in range(5)]
            for r in range(3):  # each bulk part atomic: its two events adjacent
                i = events.index(f"b{r}a")
                assert events[i + 1] == f"b{r}b"
        assert await count_rows(dsn) == len(pids) * 11


async def test_a_bulk_write_behind_a_busy_queue_is_queued_not_lost(dsn: str, journal: Journal) -> None:
    """While persist calls are queued the bulk parts join the queue (the futures path)."""
    singles = [journal.persist(f"q|{i}", [i]) for i in range(200)]
    bulk = journal.persist_many([Write(f"q|{i}", ["bulk"]) for i in range(0, 200, 2)])
    *single_results, out = await asyncio.gather(*singles, bulk)
    assert all(isinstance(r, list) for r in single_results)
    assert failures(out) == []
    assert await count_rows(dsn) == 300
    for i in (0, 2, 198):
        assert await events_of(journal, f"q|{i}") in ([i, "bulk"], ["bulk", i])


async def test_a_one_part_bulk_write_behind_a_busy_queue_gets_its_outcome(journal: Journal) -> None:
    """A queued chunk of one call is answered as a chunk (the entities' Processor writes one
    target pid this way under load); it got a persist call's answer and failed with AttributeError."""
    singles = [journal.persist(f"q1|{i}", [i]) for i in range(20)]
    *_, out = await asyncio.gather(*singles, journal.persist_many([Write("q1|bulk", ["bulk"])]))
    assert [type(o) for o in out] == [Written]
    assert await events_of(journal, "q1|bulk") == ["bulk"]


@dataclass
class _Noted:
    text: str


async def test_every_column_comes_back_as_written_whatever_its_characters(dsn: str, journal: Journal) -> None:
    """The batch statement's columns travel as JSON texts and one joined bytea (not asyncpg's
    arrays): characters that JSON, PostgreSQL's array input or a cut at a wrong offset would
    change (quotes, backslashes, commas, braces, brackets, control characters, ``NULL``, other
    scripts, NUL and empty payloads) come back unchanged, in every column and on both of the
    statement's paths (one event per call, and calls of several events)."""
    journal.serializers.register_type(_Noted, manifest='note "1", {x} [y] \\z', version=2)  # written as its manifest
    odd = ['q"uo\\te', "a,b{c}[d]", "NULL", "tab\tnew\nline\x01", "é😀", " sp ace "]
    parts: list[Write] = []
    for i, s in enumerate(odd):
        parts.append(Write(f"{s}|{i}", [{"s": s}], tags=[s, f"t{i}"], metadata={"m": s}))
        parts.append(Write(f"x|{s}", [b"\x00" + s.encode(), b"", _Noted(s)], expected_seq_nr=0))
        parts.append(Write(s, [s, None, [s]], expected_seq_nr=None))
    for many in (False, True):  # one event per call, then calls of several events
        batch = [p for p in parts if (len(p.events) > 1) == many]
        out = await journal.persist_many(batch)
        assert failures(out) == []
        for w, o in zip(batch, out, strict=True):
            assert isinstance(o, Written) and (o.persistence_id, o.first_seq_nr) == (w.persistence_id, 1)
            stored = [e async for e in journal.current_events_by_persistence_id(w.persistence_id)]
            assert [e.event for e in stored] == list(w.events)
            assert [e.tags for e in stored] == [tuple(w.tags)] * len(w.events)
            assert [e.metadata for e in stored] == [w.metadata] * len(w.events)
            assert {(e.entity_type, e.slice) for e in stored} == {(entity_type_of(o.persistence_id), slice_for(w[0]))}
