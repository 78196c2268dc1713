"""Replicated batches: dropped by exact identity (never merely because the version vector covers
them), written in one statement with per-event timestamps in causal order, with their tag rows.

Three locations in one process (three databases), direct reads, no network.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from conftest import truncate_all
from replication_helpers import Location, location_databases, open_location, open_locations

from journal import slice_for
from journal.postgres.dsn import asyncpg_dsn
from journal.replication.filters import EndpointFilters, tagged
from journal.replication.replicator import LocalSource, ReadRequest, Replicator

LOG = "Ticket"


@pytest.fixture(scope="module")
def dbs(server_dsn: str) -> Iterator[dict[str, str]]:
    with location_databases(server_dsn, ["A", "B", "C"]) as d:
        yield d


@pytest.fixture
async def locs(dbs: dict[str, str]) -> AsyncIterator[dict[str, Location]]:
    async with open_locations(dbs, [LOG]) as opened:
        yield opened


def pull(target: Location, source: Location, filters: EndpointFilters | None = None) -> Replicator:
    return Replicator(target.store, LocalSource(source.store, filters=filters), LOG, batch_size=100)


async def payloads(loc: Location) -> list[str]:
    return [env.event["v"] async for env in loc.journal.current_events_by_slices(LOG, 0, 1023)]


async def rows(loc: Location, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(asyncpg_dsn(loc.dsn))
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


NOT_FOR_C = EndpointFilters(target_locations={"C": ~tagged("not-for-c")})


@pytest.mark.parametrize("c_pulls_a_first", [True, False])
async def test_a_filtered_event_reaches_its_target_by_another_path_exactly_once(
    locs: dict[str, Location], c_pulls_a_first: bool
) -> None:
    """Triangle A-B-C; A's link to C filters e1 out. C gets e2 from A (its version vector then
    covers e1: same origin, later), and must still store e1 when B passes it on."""
    a, b, c = locs["A"], locs["B"], locs["C"]
    await a.journal.persist(f"{LOG}|1", [{"v": "e1"}], tags=["not-for-c"])
    await a.journal.persist(f"{LOG}|2", [{"v": "e2"}])
    if c_pulls_a_first:
        await pull(c, a, NOT_FOR_C).catch_up()
        assert await payloads(c) == ["e2"]
    await pull(b, a, NOT_FOR_C).catch_up()
    assert await payloads(b) == ["e1", "e2"]
    for _ in range(2):  # every link, twice, in both orders: still exactly once
        for target, source in ((c, b), (c, a), (b, c), (a, c), (a, b)):
            await pull(target, source, NOT_FOR_C if source is a else None).catch_up()
    ids = [await loc.store.event_ids(LOG) for loc in (a, b, c)]
    assert ids[0] == ids[1] == ids[2] == {("A", 1): 1, ("A", 2): 1}
    assert sorted(await payloads(c)) == ["e1", "e2"]


async def test_the_database_refuses_a_second_copy_of_an_event(locs: dict[str, Location]) -> None:
    a, b = locs["A"], locs["B"]
    await a.journal.persist(f"{LOG}|1", [{"v": "e1"}])
    await pull(b, a).catch_up()
    with pytest.raises(asyncpg.UniqueViolationError, match="event_journal_origin_idx"):
        await rows(
            b,
            "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,"
            " event_ser_manifest, event_payload, writer, origin_location, origin_seq_nr, log_seq_nr)"
            " VALUES (0, $1, $2, 9, now(), 1, '', '{}', 'x', 'A', 1, 99)",
            LOG,
            f"{LOG}|1",
        )


async def test_a_batch_keeps_causal_order_in_timestamps_and_sequence_numbers(locs: dict[str, Location]) -> None:
    """One statement per batch, yet every event its own timestamp, in the source's log order, and
    a write after the batch later than all of them."""
    a, b = locs["A"], locs["B"]
    await b.journal.persist(f"{LOG}|x", [{"v": "b0"}])  # B's own event of pid x first
    for i in range(30):  # interleaved pids, several events each, some tagged
        await a.journal.persist(f"{LOG}|{'xyz'[i % 3]}", [{"v": f"a{i}"}], tags=["t"] if i % 5 == 0 else [])
    out = await pull(b, a).step()
    assert (out.written, out.dropped) == (30, 0)
    await b.journal.persist(f"{LOG}|w", [{"v": "after"}])
    got = await rows(
        b,
        "SELECT persistence_id, seq_nr, db_timestamp, log_seq_nr, origin_seq_nr FROM event_journal "
        "WHERE entity_type = $1 AND origin_location = 'A' ORDER BY log_seq_nr",
        LOG,
    )
    stamps = [r["db_timestamp"] for r in got]
    assert stamps == sorted(stamps) and len(set(stamps)) == 30  # strictly increasing in log order
    assert [r["origin_seq_nr"] for r in got] == list(range(1, 31))
    assert [r["seq_nr"] for r in got if r["persistence_id"] == f"{LOG}|x"] == list(range(2, 12))  # after b0
    assert await payloads(b) == ["b0", *(f"a{i}" for i in range(30)), "after"]
    tag_rows = await rows(b, "SELECT sequence_nr FROM tag_views WHERE tag_name = 't' ORDER BY timestamp")
    assert len(tag_rows) == 6
    assert (await b.store.version_vector(LOG)).get("A") == 30


async def test_a_read_ahead_is_not_counted_as_stored_at_the_source(locs: dict[str, Location]) -> None:
    """The target reads the next batch while it writes one; deferred physical deletion at the
    source must count only what the target committed (``stored``), not where it reads from."""
    a, b = locs["A"], locs["B"]
    for i in range(10):
        await a.journal.persist(f"{LOG}|{i}", [{"v": i}])
    source = LocalSource(a.store)
    batch = await source.read(ReadRequest(LOG, 4, 3, "B", stored=2))
    assert [e.origin_seq_nr for e in batch.events] == [5, 6, 7] and batch.last_scanned == 7
    assert await a.store.target_progress(LOG) == {"B": 2}
    replicator = Replicator(b.store, source, LOG, batch_size=4)
    assert (await replicator.step()).written == 4
    await replicator.close()
    assert await a.store.target_progress(LOG) == {"B": 2}  # the read ahead told nothing new
    assert await replicator.catch_up() == 6
    assert (await a.store.target_progress(LOG))["B"] <= await b.store.progress(LOG, "A")


def test_the_wire_carries_payloads_identities_and_the_stored_position() -> None:
    from journal.replicated import ReplicatedEvent, ReplicationBatch
    from journal.replication.wire import decode_batch, decode_read, encode_batch, encode_read
    from journal.serialization import Serialized
    from journal.vector_time import VectorTime

    request = ReadRequest(LOG, 4, 3, "B", VectorTime({"A": 3}), ids=(("A", 1), ("C", 9)), stored=2)
    assert decode_read(encode_read(request)) == request
    events = tuple(
        ReplicatedEvent(f"{LOG}|{i}", Serialized(7, "m", bytes([i]) * i), "A", i, VectorTime({"A": i}), i + 10,
                        ("t",) if i % 2 else (), Serialized(1, "", b"\x00meta") if i == 2 else None)
        for i in range(4)
    )  # fmt: skip
    batch = ReplicationBatch("A", LOG, events, 14, covered=(("B", 3),))
    assert decode_batch(encode_batch(batch)) == batch
    with pytest.raises(ValueError, match="truncated"):
        decode_batch(encode_batch(batch)[:-1])


async def test_tags_and_metadata_arrive_as_sent_whether_a_batch_has_them_or_not(locs: dict[str, Location]) -> None:
    """A column no event of a batch has (tags, metadata) goes to the statement as one NULL that
    ``unnest`` pads; a batch where some events have them sends the whole column."""
    from journal.replicated import ReplicatedEvent
    from journal.serialization import Serialized
    from journal.vector_time import VectorTime

    b = locs["B"]
    base = 10**6 + 100 * len(await b.store.event_ids(LOG))

    def event(i: int, tags: tuple[str, ...] = (), meta: Serialized | None = None) -> ReplicatedEvent:
        return ReplicatedEvent(f"{LOG}|nul{base}-{i}", Serialized(7, "m", b"p%d" % i), "Z", base + i,
                               VectorTime({"Z": base + i}), base + i, tags, meta)  # fmt: skip

    plain = [event(1), event(2)]
    mixed = [event(3, ("t", "u")), event(4, meta=Serialized(1, "mm", b"\x00meta")), event(5)]
    await b.store.write_replicated(LOG, "Z", plain, base + 2)
    await b.store.write_replicated(LOG, "Z", mixed, base + 5)
    got = await b.store.read_ids(LOG, [e.event_id for e in plain + mixed])
    assert [(e.persistence_id, e.event, e.tags, e.metadata) for e in got] == [
        (e.persistence_id, e.event, e.tags, e.metadata) for e in plain + mixed
    ]


async def test_the_stamp_check_of_every_read_uses_the_unstamped_index_after_stale_statistics(
    dbs: dict[str, str],
) -> None:
    """Every read of a source stamps first, and the stamp asks whether anything is unstamped.
    Where the statistics were gathered before the log's first stamp (every row unstamped), that
    question must still be the partial index's, not a scan of the whole table (it was: 6.8 ms of
    server CPU per read at 50,000 events, more than the read itself)."""
    from journal.postgres.replication_store import unstamped_index_sql

    await truncate_all(dbs["A"])
    async with open_location("A", dbs["A"], [LOG]) as a:
        await a.journal.persist_many([(f"{LOG}|{i}", [{"v": i}]) for i in range(2000)])
        conn = await asyncpg.connect(asyncpg_dsn(a.dsn))
        try:
            await conn.execute("ANALYZE event_journal")  # the statistics: every row unstamped
            while await a.store.stamp(LOG) > 0:
                pass
            sql = a.store.sql.any_unstamped(LOG)  # the statement the store runs
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql, None))
            assert unstamped_index_sql(LOG).split('"')[1] in plan and "Seq Scan" not in plan, plan
            assert await conn.fetchval(sql, None) is False
            await a.journal.persist(f"{LOG}|late", [{"v": "late"}])
            assert await conn.fetchval(sql, None) is True
            assert await conn.fetchval(sql, [0]) is (slice_for(f"{LOG}|late") == 0)
        finally:
            await conn.close()


async def test_a_stamp_joins_by_the_key_after_a_plan_cached_on_an_empty_table(dbs: dict[str, str]) -> None:
    """A stamp joins its rows (an ``unnest`` of keys) to the table. A connection that cached
    the statement's generic plan while the table was nearly empty keeps a hash join over a
    sequential scan until the next ANALYZE: every stamp then read the whole table (6.3 ms
    for one row at 30,000 events, growing with it). The stamp's transaction must plan it for
    the table as it is: by the primary key."""
    await truncate_all(dbs["A"])  # statistics of an empty table
    async with open_location("A", dbs["A"], [LOG]) as a:
        await a.journal.persist(f"{LOG}|first", [{"v": 0}])
        key = f"ARRAY['{LOG}|first'], ARRAY[1::bigint], ARRAY['A'], ARRAY[1::bigint], ARRAY['{{}}'], ARRAY[1::bigint]"
        conn = await asyncpg.connect(asyncpg_dsn(a.dsn))
        try:
            await conn.execute(f"PREPARE stamp AS {a.store.sql.stamp}")
            await conn.execute("BEGIN")
            for _ in range(6):  # the sixth call and later ones: the cached generic plan
                await conn.execute(f"EXECUTE stamp({key})")
            await conn.execute("ROLLBACK")  # the plan stays cached, the rows unstamped
            await a.journal.persist_many([(f"{LOG}|{i}", [{"v": i}]) for i in range(10_000)])
            part = (await a.store.places.writing())[0]
            async with conn.transaction():
                await part.stamp(conn, [])  # the store's stamp, of no rows, in this transaction
                plan = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) EXECUTE stamp({key})"))
            assert "event_journal_pkey" in plan and "Seq Scan" not in plan, plan
        finally:
            await conn.close()


async def test_the_log_indexes_serve_their_queries_even_as_generic_plans(dbs: dict[str, str]) -> None:
    """The unstamped index is per log (its name quoted into the predicate), so a generic plan
    must still match it; the position index is partial (only stamped rows)."""
    from journal.postgres.replication_store import unstamped_index_sql

    odd = "Q'uote\\s"
    await truncate_all(dbs["A"])
    async with open_location("A", dbs["A"], [odd]) as a:
        for i in range(3):
            await a.journal.persist(f"{odd}|{i}", [{"v": i}])
        await a.journal.persist("Plain|1", [{"v": "never replicated"}])
        name = unstamped_index_sql(odd).split('"')[1]
        conn = await asyncpg.connect(asyncpg_dsn(a.dsn))
        try:
            assert await conn.fetchval("SELECT count(*) FROM pg_indexes WHERE indexname = $1", name) == 1
            await conn.execute("SET plan_cache_mode = force_generic_plan; SET enable_seqscan = off")
            sql = a.store.sql  # the statements the store runs
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql.unstamped(odd), 10))
            assert name in plan, plan
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql.read_log, odd, 0, 10))
            assert "event_journal_log_idx" in plan, plan
        finally:
            await conn.close()
        assert await a.store.stamp(odd) == 3
        events, last = await a.store.read_log(odd, 0, 10)
        assert [e.event_id for e in events] == [("A", 1), ("A", 2), ("A", 3)] and last == 3


async def test_a_batch_that_races_a_local_write_to_its_pid_is_written_again(locs: dict[str, Location]) -> None:
    """B's local write to pid x is in flight (uncommitted) when a batch with x arrives: the batch
    waits on the row, loses seq_nr 1 when the local write commits, and is written again after it."""
    import asyncio

    a, b = locs["A"], locs["B"]
    await a.journal.persist(f"{LOG}|x", [{"v": "from A"}])
    await a.store.stamp(LOG)
    events, last = await a.store.read_log(LOG, 0, 10)
    conn = await asyncpg.connect(asyncpg_dsn(b.dsn))
    try:
        tr = conn.transaction()
        await tr.start()
        await b.journal.persist_in(conn, f"{LOG}|x", [{"v": "local at B"}])
        write = asyncio.create_task(b.store.write_replicated(LOG, "A", events, last))
        async with asyncio.timeout(60):  # the batch's insert waits on the uncommitted row
            while not await b.journal.backend.pool.fetchval(  # noqa: ASYNC110
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            ):
                await asyncio.sleep(0.02)
        await tr.commit()
        async with asyncio.timeout(60):
            out = await write
    finally:
        await conn.close()
    assert out.written == 1
    got = await rows(b, "SELECT seq_nr, origin_location FROM event_journal WHERE persistence_id = $1 ORDER BY 1",
                     f"{LOG}|x")  # fmt: skip
    assert [(r[0], r[1]) for r in got] == [(1, "B"), (2, "A")]  # stamped by the batch, before it
