"""The optimistic insert (calls that name expected_seq_nr) against a real PostgreSQL: a stale or
gapped call amid good ones fails alone, a refused statement leaves nothing of the refused call,
the timestamp rules hold, concurrent writers through persist and persist_many never share a
sequence number, and an interrupted statement is resolved exactly. Both shapes are covered:
persist_many's columns (one event per part) and group-committed requests."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

import asyncpg
import pytest

from journal import Journal, JournalSettings, SequenceConflict, StorageError, Write, Written, failures, open_journal
from journal.envelope import ROW_STEP
from journal.write_batch import WriteBatch
from tests.support.rows import count_rows


async def seq_nrs(j: Journal, pid: str) -> list[int]:
    return [e.seq_nr async for e in j.current_events_by_persistence_id(pid)]


@pytest.mark.parametrize("events_per_part", [1, 2])  # 1: columns; 2: requests
async def test_a_stale_part_amid_good_parts_fails_alone(dsn: str, journal: Journal, events_per_part: int) -> None:
    await journal.persist("st|taken", ["a", "b", "c"])
    writes = [Write(f"st|{i}", [i] * events_per_part, 0) for i in range(40)]
    writes.insert(17, Write("st|taken", ["x"] * events_per_part, 1))  # 3 are stored
    out = await journal.persist_many(writes)
    assert [i for i, _ in failures(out)] == [17]
    assert isinstance(out[17], SequenceConflict) and out[17].persistence_id == "st|taken"
    assert all(isinstance(o, Written) and (o.first_seq_nr, o.last_seq_nr) == (1, events_per_part) for o in out[:17])
    assert [e.event async for e in journal.current_events_by_persistence_id("st|taken")] == ["a", "b", "c"]
    assert await count_rows(dsn) == 3 + 40 * events_per_part


@pytest.mark.parametrize("events_per_part", [1, 2])
async def test_a_part_past_the_stored_highest_fails_alone(dsn: str, journal: Journal, events_per_part: int) -> None:
    """A gap: the primary key cannot see it; the statement's check does."""
    await journal.persist("gap|short", ["a"])
    writes = [Write(f"gap|{i}", [i] * events_per_part, 0) for i in range(10)]
    writes += [Write("gap|short", ["z"] * events_per_part, 2), Write("gap|none", ["z"] * events_per_part, 5)]
    out = await journal.persist_many(writes)
    assert [i for i, _ in failures(out)] == [10, 11]
    assert all(isinstance(e, SequenceConflict) for _, e in failures(out))
    assert await count_rows(dsn, "gap|short") == 1 and await count_rows(dsn, "gap|none") == 0
    assert await count_rows(dsn) == 1 + 10 * events_per_part


async def test_expected_zero_after_the_first_events_were_deleted_is_a_conflict(dsn: str, journal: Journal) -> None:
    """Rows 6..10 remain: writing seq 1 would not hit the key; the check refuses it."""
    await journal.persist("del|1", list(range(10)))
    await journal.delete_events_to("del|1", 5)
    out = await journal.persist_many([Write("del|1", ["again"], 0), Write("del|ok", ["x"], 0)])
    assert isinstance(out[0], SequenceConflict)
    assert isinstance(out[1], Written)
    out = await journal.persist_many([Write("del|1", ["stale"], 5), Write("del|ok2", ["x"], 0)])
    assert isinstance(out[0], SequenceConflict)  # row 5 is deleted, 10 is the highest
    out = await journal.persist_many([Write("del|1", ["next"], 10), Write("del|ok3", ["x"], 0)])
    assert isinstance(out[0], Written) and out[0].first_seq_nr == 11
    assert await seq_nrs(journal, "del|1") == [6, 7, 8, 9, 10, 11]


async def test_a_refused_row_leaves_nothing_of_its_part(dsn: str, journal: Journal) -> None:
    """The optimistic statement fails as a whole; the general path then isolates the refused part."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """CREATE FUNCTION reject_known() RETURNS trigger AS $$
               BEGIN IF NEW.persistence_id = 'rf|bad' THEN RAISE EXCEPTION 'injected refusal'; END IF;
               RETURN NEW; END $$ LANGUAGE plpgsql;
               CREATE TRIGGER reject_known BEFORE INSERT ON event_journal
                 FOR EACH ROW EXECUTE FUNCTION reject_known();"""
        )
        writes = [Write(f"rf|{i}", [i], 0) for i in range(30)]
        writes.insert(11, Write("rf|bad", ["no"], 0))
        out = await journal.persist_many(writes)
        assert [i for i, _ in failures(out)] == [11]
        assert isinstance(out[11], StorageError) and "injected refusal" in str(out[11])
        assert await count_rows(dsn, "rf|bad") == 0
        assert await count_rows(dsn) == 30
    finally:
        await conn.execute(
            "DROP TRIGGER IF EXISTS reject_known ON event_journal; DROP FUNCTION IF EXISTS reject_known()"
        )
        await conn.close()


async def an_hour_ahead(dsn: str, pid: str) -> datetime:
    """Moves the pid's events an hour ahead of the clock (a clock step back); their newest stamp."""
    conn = await asyncpg.connect(dsn)
    try:
        sql = "UPDATE event_journal SET db_timestamp = db_timestamp + interval '1 hour' WHERE persistence_id = $1"
        await conn.execute(sql, pid)
        newest: datetime = await conn.fetchval(
            "SELECT max(db_timestamp) FROM event_journal WHERE persistence_id = $1", pid
        )
        return newest
    finally:
        await conn.close()


async def test_one_base_per_statement_above_every_previous_event_of_its_pids(dsn: str, journal: Journal) -> None:
    """The per-pid monotonic rule holds even when a previous event's timestamp is ahead of the
    database clock (a clock step back): the statement's one base timestamp is raised above it,
    and its rows follow one microsecond apart."""
    await journal.persist("ts|ahead", ["old"])
    ahead = await an_hour_ahead(dsn, "ts|ahead")
    out = await journal.persist_many([Write(f"ts|{i}", [i], 0) for i in range(20)] + [Write("ts|ahead", ["new"], 1)])
    assert failures(out) == []
    stamps = [o.db_timestamp for o in out if isinstance(o, Written)]
    base = ahead + timedelta(microseconds=1)
    assert stamps == [base + i * ROW_STEP for i in range(21)]  # one statement, one base
    stored = [e async for e in journal.current_events_by_persistence_id("ts|ahead")]
    assert stored[1].db_timestamp > stored[0].db_timestamp


@pytest.mark.parametrize("expected", [2, None])
async def test_a_lone_persist_is_stamped_above_its_pids_newest_event(
    dsn: str, journal: Journal, expected: int | None
) -> None:
    """A lone persist (its own statement) reads the pid's newest event, from ``expected_seq_nr``
    on when given, and stamps above it even when it is ahead of the clock; a stale or gapped
    ``expected_seq_nr`` still fails."""
    await journal.persist("l|ahead", ["a", "b"])
    ahead = await an_hour_ahead(dsn, "l|ahead")
    for wrong in (1, 3):
        with pytest.raises(SequenceConflict):
            await journal.persist("l|ahead", ["x"], expected_seq_nr=wrong)
    written = await journal.persist("l|ahead", ["c"], expected_seq_nr=expected)
    assert [(e.seq_nr, e.db_timestamp) for e in written] == [(3, ahead + ROW_STEP)]
    assert await seq_nrs(journal, "l|ahead") == [1, 2, 3]


async def test_group_committed_calls_with_expected_seq_nr_fail_alone(dsn: str, journal: Journal) -> None:
    """The group commit's batches take the optimistic insert too (requests, not columns)."""
    await journal.persist("gc|taken", ["a"])
    calls = [journal.persist(f"gc|{i}", [i], expected_seq_nr=0) for i in range(50)]
    calls.insert(25, journal.persist("gc|taken", ["b"], expected_seq_nr=0))
    got = await asyncio.gather(*calls, return_exceptions=True)
    assert [i for i, g in enumerate(got) if isinstance(g, BaseException)] == [25]
    assert isinstance(got[25], SequenceConflict)
    assert await count_rows(dsn) == 51


async def test_concurrent_writers_through_persist_and_persist_many_never_share_a_seq_nr(dsn: str) -> None:
    """Three writers race on the same pids, each believing the highest it last saw: every write
    acknowledged is stored exactly once, numbers stay gapless, every refusal is a conflict."""
    from tests.conftest import truncate_all

    await truncate_all(dsn)
    settings = JournalSettings.load(env={}, dsn=dsn, max_batch_events=40)
    pids = [f"race|{i}" for i in range(60)]
    async with open_journal(dsn, settings=settings) as a, open_journal(dsn, settings=settings) as b:
        acked: list[tuple[str, int, str]] = []

        async def bulk_writer(j: Journal, name: str) -> None:
            for k in range(8):
                highest = {p: await j.highest_seq_nr(p) for p in pids}
                out = await j.persist_many([Write(p, [f"{name}{k}"], highest[p]) for p in pids])
                for p, o in zip(pids, out, strict=True):
                    if isinstance(o, Written):
                        acked.append((p, o.first_seq_nr, f"{name}{k}"))
                    else:
                        assert isinstance(o, SequenceConflict), o

        async def single_writer(j: Journal, pid: str) -> None:
            for k in range(6):
                seq = await j.highest_seq_nr(pid)
                try:
                    envs = await j.persist(pid, [f"s{k}"], expected_seq_nr=seq)
                except SequenceConflict:
                    continue
                acked.append((pid, envs[0].seq_nr, f"s{k}"))

        await asyncio.gather(
            bulk_writer(a, "A"), bulk_writer(b, "B"), *(single_writer(a if i % 2 else b, p) for i, p in enumerate(pids))
        )
        assert len({(p, s) for p, s, _ in acked}) == len(acked)  # no number acknowledged twice
        for p in pids:
            stored = [(e.seq_nr, e.event) async for e in a.current_events_by_persistence_id(p)]
            assert [s for s, _ in stored] == list(range(1, len(stored) + 1))
            assert sorted((s, ev) for q, s, ev in acked if q == p) == stored
        assert await count_rows(dsn) == len(acked)
        assert len(acked) > len(pids)  # the race wrote something beyond each pid's first event


async def test_crossing_bulk_writes_of_two_journals_do_not_wait_on_each_other_forever(dsn: str) -> None:
    """Two journals' bulk writes on the same pids in crossed chunk order: A's first chunk holds
    P's rows (uncommitted until A's last chunk is written) while B's waits on them, and B's first
    holds Q's while A's second waits on them. PostgreSQL cannot see the cycle (it closes through
    the clients) and, before, both waited forever (the hang of this file on a loaded machine:
    two writers 'active' on transactionid, two 'idle in transaction'). A bulk statement now
    waits at most bulk_lock_timeout for a row lock; its chunk is written again after the others
    commit, so every part ends written or in conflict."""
    from tests.conftest import truncate_all

    await truncate_all(dsn)
    settings = JournalSettings.load(env={}, dsn=dsn, max_batch_events=40, bulk_in_flight=2)
    p, q = [f"cross|p{i}" for i in range(40)], [f"cross|q{i}" for i in range(40)]
    async with open_journal(dsn, settings=settings) as a, open_journal(dsn, settings=settings) as b:
        for _ in range(5):
            await truncate_all(dsn)
            out_a, out_b = await asyncio.wait_for(
                asyncio.gather(
                    a.persist_many([Write(pid, ["a"], 0) for pid in p + q]),
                    b.persist_many([Write(pid, ["b"], 0) for pid in q + p]),
                ),
                60,
            )
            for pid, got_a, got_b in zip(p + q, out_a, out_b[40:] + out_b[:40], strict=True):
                assert {type(got_a), type(got_b)} == {Written, SequenceConflict}, (pid, got_a, got_b)
            assert await count_rows(dsn) == 80


async def test_an_interrupted_bulk_statement_is_resolved_exactly(dsn: str, journal: Journal) -> None:
    """The client loses its connection mid-statement; the server commits the statement. The
    journal waits for it, reads the rows, and reports every part written, none twice."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """CREATE FUNCTION slow_known() RETURNS trigger AS $$
               BEGIN IF NEW.persistence_id = 'ir|7' THEN PERFORM pg_sleep(1); END IF; RETURN NEW; END $$
               LANGUAGE plpgsql;
               CREATE TRIGGER slow_known BEFORE INSERT ON event_journal FOR EACH ROW EXECUTE FUNCTION slow_known();"""
        )
        task = asyncio.create_task(journal.persist_many([Write(f"ir|{i}", [i], 0) for i in range(20)]))
        app = journal.backend.writers.application_name  # type: ignore[attr-defined]
        deadline = time.monotonic() + 10
        while not await conn.fetchval(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'", app
        ):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        for c in list(journal.backend.writers._all):  # type: ignore[attr-defined]
            c.terminate()  # the client side goes away; the server keeps executing and commits
        out = await asyncio.wait_for(task, 30)
        assert failures(out) == []
        assert all(isinstance(o, Written) and o.first_seq_nr == 1 for o in out)
        assert await count_rows(dsn) == 20
    finally:
        await conn.execute("DROP TRIGGER IF EXISTS slow_known ON event_journal; DROP FUNCTION IF EXISTS slow_known()")
        await conn.close()


async def test_a_bulk_write_on_a_connection_that_died_while_idle_begins_on_a_new_one(
    dsn: str, journal: Journal
) -> None:
    """The server ended an idle write connection (a restart, a proxy, or the interrupted test
    above under load: its terminate can land before the bulk write's BEGIN): the bulk write
    begins again on a new connection. Before: BEGIN's InterfaceError failed every part with
    "StorageError: write of 'idle|0' failed: ... connection is closed"."""
    await journal.persist_many([Write(f"warm|{i}", [i], 0) for i in range(4)])  # write connections now idle
    conn = await asyncpg.connect(dsn)
    try:
        app = journal.backend.writers.application_name  # type: ignore[attr-defined]
        ended = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app
        )
        assert ended >= 1
        deadline = time.monotonic() + 10
        while await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        out = await journal.persist_many([Write(f"idle|{i}", [i], 0) for i in range(20)])
        assert failures(out) == []
        assert await count_rows(dsn) == 24
    finally:
        await conn.close()


async def test_write_connections_ended_at_any_point_of_a_bulk_write_lose_nothing(dsn: str, journal: Journal) -> None:
    """The client ends every write connection at 0, 1, 2, ... ms into a bulk write: in BEGIN, in
    asyncpg's type introspection before the statement, in the statement, in COMMIT. Every part
    is written once. Before: ended during the introspection, asyncpg raised AttributeError
    ('NoneType' object has no attribute 'bind_execute'), the bulk write took it for a refusal,
    sent ROLLBACK on the closed connection, and every part failed with "StorageError: ...
    InterfaceError: connection is closed" (what test_an_interrupted_bulk_statement_is_resolved_exactly
    met on a loaded machine, where its terminate landed in the introspection)."""
    loop = asyncio.get_running_loop()
    writers = journal.backend.writers  # type: ignore[attr-defined]

    def end_all() -> None:
        for c in list(writers._all):
            c.terminate()

    written = 0
    for step in range(40):
        timer = loop.call_later(step / 1000, end_all)
        out = await journal.persist_many([Write(f"any{step}|{i}", [i], 0) for i in range(20)])
        timer.cancel()
        assert failures(out) == [], (step, failures(out)[:1])
        assert all(isinstance(o, Written) and o.first_seq_nr == 1 for o in out)
        written += 20
        assert await count_rows(dsn) == written


async def test_a_killed_bulk_statement_is_sent_again(dsn: str, journal: Journal) -> None:
    """The server process dies mid-statement (nothing committed): the parts are found not
    written and sent again, once."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """CREATE FUNCTION slow_once() RETURNS trigger AS $$
               BEGIN IF NEW.persistence_id = 'kb|3' AND NOT EXISTS (SELECT 1 FROM pg_class WHERE relname = 'kb_done')
               THEN PERFORM pg_sleep(5); END IF; RETURN NEW; END $$ LANGUAGE plpgsql;
               CREATE TRIGGER slow_once BEFORE INSERT ON event_journal FOR EACH ROW EXECUTE FUNCTION slow_once();"""
        )
        task = asyncio.create_task(journal.persist_many([Write(f"kb|{i}", [i], 0) for i in range(20)]))
        deadline = time.monotonic() + 10
        while True:
            pid = await conn.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' "
                "AND application_name LIKE 'slice-journal writer%' AND pid <> pg_backend_pid()"
            )
            if pid is not None:
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await conn.execute("CREATE TABLE kb_done ()")  # the resent statement does not sleep
        assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
        out = await asyncio.wait_for(task, 30)
        assert failures(out) == []
        assert await count_rows(dsn) == 20
        for i in (0, 3, 19):
            assert await seq_nrs(journal, f"kb|{i}") == [1]
    finally:
        await conn.execute(
            "DROP TRIGGER IF EXISTS slow_once ON event_journal; DROP FUNCTION IF EXISTS slow_once(); "
            "DROP TABLE IF EXISTS kb_done"
        )
        await conn.close()


def test_batch_chunks_and_selections_line_up() -> None:
    c = WriteBatch(
        ["a|1", "b|2", "a|3"], ["a", "b", "a"], [1, 2, 3], [0, 4, 7], [1, 1, 1], [b"x", b"y", b"z"], [1, 0, 1],
        ["", "", ""], [(), (), ()], [None, None, None],
    )  # fmt: skip
    part = c.chunk(1, 3)
    assert len(part) == 2 and part.persistence_ids == ["b|2", "a|3"]
    assert list(zip(part.persistence_ids, part.entity_types, part.slices, part.expected_seq_nrs, strict=True)) == [
        ("b|2", "b", 2, 4), ("a|3", "a", 3, 7),
    ]  # fmt: skip
    assert [(e.ser_id, e.payload) for events in part.serialized() for e in events] == [(0, b"y"), (1, b"z")]
    several = WriteBatch(
        ["a|1", "b|2", "a|3"], ["a", "b", "a"], [1, 2, 3], [0, None, 7], [2, 1, 3],
        [b"x1", b"x2", b"y", b"z1", b"z2", b"z3"], [1] * 6, [""] * 6, [(), ("t",), ()], [None] * 3,
    )  # fmt: skip
    assert several.chunk(1, 3).payloads == [b"y", b"z1", b"z2", b"z3"]
    picked = several.select([2, 0])
    assert picked.persistence_ids == ["a|3", "a|1"] and picked.counts == [3, 2]
    assert picked.payloads == [b"z1", b"z2", b"z3", b"x1", b"x2"] and picked.expected_seq_nrs == [7, 0]
    assert [[e.payload for e in events] for events in several.serialized()] == [
        [b"x1", b"x2"],
        [b"y"],
        [b"z1", b"z2", b"z3"],
    ]
    assert WriteBatch.concat([several.chunk(0, 1), several.chunk(1, 3)]) == several


async def test_column_parts_of_every_plain_kind_read_back(dsn: str, journal: Journal) -> None:
    """JSON values, bytes and plain tuples all travel as columns and read back as written."""
    values: list[object] = [{"a": 1}, [1, 2], "text", 7, 1.5, True, b"\x00raw"]
    writes: list[object] = [Write(f"kind|{i}", [v], 0) for i, v in enumerate(values)]
    writes.append(("kind|tuple", ({"t": 1},), 0))
    writes.append(Write("other|1", ["another entity type"], 0))
    out = await journal.persist_many(writes)  # type: ignore[arg-type]
    assert failures(out) == []
    for i, v in enumerate(values):
        assert [e.event async for e in journal.current_events_by_persistence_id(f"kind|{i}")] == [v]
    assert [e.event async for e in journal.current_events_by_persistence_id("kind|tuple")] == [{"t": 1}]
    stored = [e async for e in journal.current_events_by_persistence_id("other|1")]
    assert stored[0].entity_type == "other" and stored[0].event == "another entity type"


async def test_bad_column_parts_raise_before_anything_is_written(dsn: str, journal: Journal) -> None:
    from journal import InvalidArgument, SerializationError

    good = [Write(f"bad|{i}", [i], 0) for i in range(5)]
    with pytest.raises(SerializationError, match="part 5"):
        await journal.persist_many([*good, Write("bad|x", [object()], 0)])
    with pytest.raises(InvalidArgument, match=r"part 5.*appears in an earlier part"):
        await journal.persist_many([*good, Write("bad|0", [1], 0)])
    with pytest.raises(InvalidArgument, match="part 5"):
        await journal.persist_many([*good, Write("bad|y", [1], 2**63 - 1)])  # its event would overflow
    assert await count_rows(dsn) == 0


async def test_written_envelopes_build_their_offsets_on_first_access(journal: Journal) -> None:
    import pickle

    from journal import EventEnvelope
    from journal.offsets import SequenceOffset

    envs = await journal.persist("env|1", ["a", "b"], expected_seq_nr=0)
    assert [e.offset for e in envs] == [SequenceOffset(1), SequenceOffset(2)]
    e = envs[1]
    same = EventEnvelope(
        e.persistence_id, e.entity_type, e.slice, 2, e.db_timestamp, "b", SequenceOffset(2), writer=e.writer
    )
    assert e == same and hash(e) == hash(same) and repr(e) == repr(same)
    assert pickle.loads(pickle.dumps(e)) == same


async def test_parts_with_metadata_and_several_events_keep_them(journal: Journal) -> None:
    """Such parts travel as requests through the optimistic insert (the processor's shape)."""
    await journal.persist("md|1", ["first"])
    out = await journal.persist_many(
        [
            Write("md|1", ["x", "y", "z"], 1, metadata={"source_seq_nr": 9}),
            Write("md|2", [b"raw"], 0, metadata={"source_seq_nr": 3}),
            Write("md|3", ["plain"], 0),
        ]
    )
    assert failures(out) == []
    first = out[0]
    assert isinstance(first, Written) and (first.first_seq_nr, first.last_seq_nr) == (2, 4)
    stored = [e async for e in journal.current_events_by_persistence_id("md|1")]
    meta = {"source_seq_nr": 9}
    assert [(e.seq_nr, e.event, e.metadata) for e in stored] == [
        (1, "first", None), (2, "x", meta), (3, "y", meta), (4, "z", meta),
    ]  # fmt: skip
    assert [e.db_timestamp - stored[1].db_timestamp for e in stored[1:]] == [i * ROW_STEP for i in range(3)]
    two = [e async for e in journal.current_events_by_persistence_id("md|2")]
    assert [(e.event, e.metadata) for e in two] == [(b"raw", {"source_seq_nr": 3})]
    three = [e async for e in journal.current_events_by_persistence_id("md|3")]
    assert [(e.event, e.metadata) for e in three] == [("plain", None)]


async def test_group_committed_one_event_calls_of_mixed_kinds_read_back(journal: Journal) -> None:
    """A batch of one-event calls with expected_seq_nr: entity types, metadata and serializers differ."""
    calls = [
        journal.persist(f"{t}|{i}", [v], expected_seq_nr=0, metadata=m)
        for i in range(30)
        for t, v, m in [("cart", {"n": i}, None), ("order", b"\x01" * (i + 1), {"by": i})]
    ]
    got = await asyncio.gather(*calls)
    assert all(len(envs) == 1 and envs[0].seq_nr == 1 for envs in got)
    for i in (0, 17, 29):
        (cart,) = [e async for e in journal.current_events_by_persistence_id(f"cart|{i}")]
        assert (cart.entity_type, cart.event, cart.metadata) == ("cart", {"n": i}, None)
        (order,) = [e async for e in journal.current_events_by_persistence_id(f"order|{i}")]
        assert (order.entity_type, order.event, order.metadata) == ("order", b"\x01" * (i + 1), {"by": i})
