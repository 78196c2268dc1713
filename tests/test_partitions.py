"""A journal over several PostgreSQL servers by slice range: every operation goes where its slice is.

Real servers (``partition_fixtures``): each row is looked up in the database that must hold it,
and nowhere else.
"""

from __future__ import annotations

import asyncio
import hashlib
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import asyncpg
import pytest

from journal import (
    Journal,
    JournalSettings,
    SequenceConflict,
    SliceRangeMoved,
    Write,
    Written,
    open_journal,
    slice_for,
)
from journal.cleanup import Cleanup, CleanupAction
from journal.partitioned.backend import PartitionedBackend
from journal.partitioned.layout import PartitionMap
from journal.postgres import MOVED, OWNED, PartitionRow, asyncpg_dsn, redact

PIDS = [f"route|{hashlib.sha1(bytes([i])).hexdigest()[:8]}" for i in range(120)]  # spread over the slices


def settings(dsns: Sequence[str], **more: object) -> JournalSettings:
    return JournalSettings.load(env={}, databases=list(dsns), **more)


@asynccontextmanager
async def partitioned(dsns: Sequence[str], **more: object) -> AsyncIterator[Journal]:
    async with open_journal(settings=settings(dsns, **more)) as j:
        assert isinstance(j.backend, PartitionedBackend)
        yield j


async def stored(dsn: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def keys(dsn: str, table: str = "event_journal") -> set[tuple[str, int]]:
    col = "seq_nr" if table in ("event_journal", "snapshot") else "sequence_nr"
    return {(r[0], r[1]) for r in await stored(dsn, f"SELECT persistence_id, {col} FROM {table}")}


def test_the_layout_is_r2dbcs_and_the_newest_epoch_wins() -> None:
    assert PartitionMap.seed(4) == [(0, 255), (256, 511), (512, 767), (768, 1023)]
    assert PartitionMap.seed(1) == [(0, 1023)]
    m = PartitionMap.build(2, {0: [], 1: []})  # never partitioned: each serves its range of the layout
    assert [(p.database, p.min_slice, p.max_slice) for p in m.pieces(0, 1023)] == [(0, 0, 511), (1, 512, 1023)]
    m = PartitionMap.build(
        2,
        {
            0: [PartitionRow(0, 511, OWNED, 0)],
            1: [PartitionRow(512, 767, MOVED, 3, "postgresql:///c"), PartitionRow(768, 1023, OWNED, 0)],
            2: [PartitionRow(512, 767, OWNED, 3)],
        },
    )
    assert m.epoch == 3
    assert [(p.database, p.min_slice, p.max_slice) for p in m.pieces(500, 800)] == [
        (0, 500, 511), (2, 512, 767), (1, 768, 800),
    ]  # fmt: skip
    assert m.databases_of(0, 1023) == [0, 2, 1]


async def test_every_operation_goes_to_the_database_of_its_slice(parts: list[str]) -> None:
    a, b = parts[0], parts[1]  # two servers
    low = {p for p in PIDS if slice_for(p) < 512}
    assert 20 < len(low) < len(PIDS) - 20  # both databases get pids
    async with partitioned([a, b], eventual_consistency_delay=0.0) as j:
        for p in PIDS:
            await j.persist(p, [{"n": 1}], tags=["route-tag"] if slice_for(p) % 3 == 0 else ())
        # persist_many across both databases: each part alone; a stale part fails alone
        stale = PIDS[0]
        got = await j.persist_many([Write(p, [{"n": 2}], expected_seq_nr=0 if p == stale else 1) for p in PIDS])
        assert isinstance(got[0], SequenceConflict)
        assert all(isinstance(o, Written) and o.first_seq_nr == 2 for o in got[1:])
        # every row is in the database of its slice, and only there
        expected = {(p, n) for p in PIDS for n in (1, 2) if (p, n) != (stale, 2)}
        in_a, in_b = await keys(a), await keys(b)
        assert in_a == {k for k in expected if slice_for(k[0]) < 512}
        assert in_b == {k for k in expected if slice_for(k[0]) >= 512}
        tagged = {(p, 1) for p in PIDS if slice_for(p) % 3 == 0}
        assert await keys(a, "tag_views") | await keys(b, "tag_views") == tagged
        assert not {k for k in await keys(a, "tag_views") if slice_for(k[0]) >= 512}
        # reads by persistence id, highest sequence number, deletes
        one = next(p for p in PIDS if slice_for(p) >= 512 and p != stale)
        assert await j.highest_seq_nr(one) == 2
        assert [e.seq_nr async for e in j.current_events_by_persistence_id(one)] == [1, 2]
        await j.delete_events_to(one, 2)
        assert await j.highest_seq_nr(one) == 2  # the tombstone keeps it
        assert [r[0] for r in await stored(b, "SELECT deleted FROM event_journal WHERE persistence_id = $1", one)] == [
            True
        ]
        # snapshots
        await j.save_snapshot(one, 2, {"s": 1}, keep=2)
        await j.save_snapshot(one, 3, {"s": 2}, keep=2)
        assert (await j.load_snapshot(one)).state == {"s": 2}  # type: ignore[union-attr]
        assert len(await j.load_snapshots(one)) == 2
        assert await keys(b, "snapshot") == {(one, 3)} and await keys(a, "snapshot") == set()
        await j.delete_snapshot(one)
        assert await j.load_snapshot(one) is None
        # events by tag span both databases
        by_tag = [(e.persistence_id, e.seq_nr) async for e in j.current_events_by_tag("route-tag")]
        assert sorted(by_tag) == sorted(tagged)
        # the pids, once each, in order
        ids = [p async for p in j.current_persistence_ids("route")]
        assert ids == sorted(PIDS)
        # cleanup, where the pid is
        other = next(p for p in PIDS if slice_for(p) < 512 and p != stale)
        await Cleanup(j.backend).run(CleanupAction.DELETE_ALL, [other])
        live = "SELECT seq_nr FROM event_journal WHERE persistence_id = $1 AND NOT deleted"
        assert await stored(a, live, other) == []  # a tombstone may keep the highest number
        # persist_in on a connection of the database that serves the pid
        pool = j.backend.pool_for(other)  # type: ignore[attr-defined]
        async with pool.acquire() as conn, conn.transaction():
            await j.persist_in(conn, other, [{"n": 3}])
        assert (other, 3) in await keys(a)
        # on a connection of the other database: refused there, nothing written
        async with j.backend.pool_for(one).acquire() as conn:  # type: ignore[attr-defined]
            with pytest.raises(SliceRangeMoved):
                await j.persist_in(conn, other, [{"n": 4}])
        assert (other, 4) not in await keys(a) | await keys(b)


async def test_a_slice_query_over_several_databases_has_one_databases_offsets(parts: list[str]) -> None:
    async with partitioned(parts[:4], buffer_size=7, catch_up_buffer_size=7) as j:  # small pages: many merges
        for i in range(3):
            await j.persist_many([Write(p, [{"i": i}, {"i": i}]) for p in PIDS])
        everything = [e async for e in j.current_events_by_slices("route", 0, 1023)]
        assert len(everything) == len(PIDS) * 6
        order = [(e.db_timestamp, e.seq_nr, e.persistence_id) for e in everything]
        assert order == sorted(order) and len(set(order)) == len(order)
        for k in (0, 5, 300, len(everything) - 2):  # resuming from any offset gives exactly the rest
            rest = [e async for e in j.current_events_by_slices("route", 0, 1023, everything[k].offset)]
            assert [(e.persistence_id, e.seq_nr) for e in rest] == [
                (e.persistence_id, e.seq_nr) for e in everything[k + 1 :]
            ]
        # a range inside one database: only its slices (their offsets are that query's own: an
        # offset's `seen` names the pids at its timestamp within the query's range)
        inside = [e async for e in j.current_events_by_slices("route", 256, 511)]
        assert [(e.persistence_id, e.seq_nr, e.db_timestamp, e.event) for e in inside] == [
            (e.persistence_id, e.seq_nr, e.db_timestamp, e.event) for e in everything if 256 <= e.slice <= 511
        ]


async def test_a_plain_journal_on_a_partitioned_database_is_refused_then_follows_the_map(
    parts: list[str],
) -> None:
    async with partitioned(parts[:2]):
        pass  # each database records its range
    high = next(p for p in PIDS if slice_for(p) >= 512)
    low = next(p for p in PIDS if slice_for(p) < 512)
    from journal.postgres import PostgresBackend

    # its range's floor (as a moved range's new home has) is a lone write's least timestamp
    [(floor,)] = await stored(parts[0], "UPDATE slice_partition SET floor = now() + interval '1 hour' RETURNING floor")
    # one database's backend alone (no map): writes of slices it does not serve are refused in the database
    b = PostgresBackend(parts[0], JournalSettings.load(env={}, dsn=parts[0]))
    await b.start()
    try:
        j = Journal(b, b.settings)
        with pytest.raises(SliceRangeMoved) as refused:
            await j.persist(high, [{"n": 1}])
        assert (refused.value.min_slice, refused.value.state) == (slice_for(high), None)
        with pytest.raises(SliceRangeMoved):  # the owner check comes first, not the expected_seq_nr check
            await j.persist(high, [{"n": 1}], expected_seq_nr=3)
        assert [e.db_timestamp >= floor for e in await j.persist(low, [{"n": 1}])] == [True]
        with pytest.raises(SliceRangeMoved):  # nor read by slice
            [e async for e in j.current_events_by_slices("route", 512, 1023)]
        await j.close()
    finally:
        await b.close()
    assert await keys(parts[0]) == {(low, 1)}
    # a writer whose map epoch is older than a range's last change is refused, reloads, retries
    async with partitioned(parts[:2]) as j:
        conn = await asyncpg.connect(asyncpg_dsn(parts[1]))
        await conn.execute("UPDATE slice_partition SET epoch = 5")
        await conn.close()
        await j.persist(high, [{"n": 1}])
        assert j.backend.dbs.map.epoch == 5  # type: ignore[attr-defined]


async def test_journal_info_and_projections_status_show_each_database(parts: list[str]) -> None:
    import json
    import os
    import sys

    dbs = parts[:2]
    async with partitioned(dbs) as j:
        await j.persist_many([Write(p, [{"n": 1}]) for p in PIDS])
    low = sum(1 for p in PIDS if slice_for(p) < 512)
    conn = await asyncpg.connect(asyncpg_dsn(dbs[0]))  # the home database: a projection's offset
    await conn.execute(
        "INSERT INTO projection_timestamp_offset_store VALUES ('p-info', '0-1023', 3, 'x', 1, now(), now())"
    )
    await conn.close()
    env = {**os.environ, "JOURNAL_DATABASES": " ".join(dbs)}

    async def cli(*args: str) -> str:
        p = await asyncio.create_subprocess_exec(sys.executable, "-m", *args, "--dsn", dbs[0], env=env, stdout=PIPE)
        out, _ = await p.communicate()
        assert p.returncode == 0
        return out.decode()

    info = await cli("journal", "info")
    blocks = info.split("database:")[1:]
    assert len(blocks) == 2
    assert "slices:          0-511" in blocks[0] and f"events:          {low}" in blocks[0]
    assert "slices:          512-1023" in blocks[1] and f"events:          {len(PIDS) - low}" in blocks[1]
    status = json.loads(await cli("projections", "status", "p-info", "--json"))
    ranges = [(r["slices"], r["database"]) for r in status[0]["ranges"]]
    names = [redact(d) for d in dbs]
    assert ranges == [("0-511", names[0]), ("512-1023", names[1])]


async def test_entities_write_and_recover_where_their_slice_is(parts: list[str]) -> None:
    from journal import EntityRegistry
    from tests.reliable_fixtures import Order
    from tests.support.waiting import wait_until

    a, b = parts[0], parts[1]
    ids = [f"e{i}" for i in range(40)]
    low = next(i for i in ids if slice_for(f"order|{i}") < 512)
    high = next(i for i in ids if slice_for(f"order|{i}") >= 512)
    async with partitioned([a, b]) as j:
        async with EntityRegistry(j) as reg:
            for i in (low, high):
                assert await reg.ask(Order, i, ("place", "x")) == ["placed:x"]
                await wait_until(lambda i=i: _has(reg.ask(Order, i, ("read",)), 3), what="the follow-ups")
        async with EntityRegistry(j) as reg:  # recovered from the database of its slice
            assert await reg.ask(Order, high, ("read",)) == ["placed:x", "reserved:x", "shipped:x"]
    assert {k[1] for k in await keys(a) if k[0] == f"order|{low}"} == {1, 2, 3}
    assert {k[1] for k in await keys(b) if k[0] == f"order|{high}"} == {1, 2, 3}
    assert not {k for k in await keys(a) if k[0] == f"order|{high}"}


async def _has(state: object, n: int) -> bool:
    return len(await state) == n  # type: ignore[misc,arg-type]


async def test_a_worker_over_a_partitioned_journal_runs_on_the_home_databases_pool(parts: list[str]) -> None:
    from projections import Worker
    from tests.support.waiting import wait_until

    dbs = parts[:2]
    fast = {"lease_ttl": 1.5, "lease_renew_interval": 0.3, "handler_backoff": 0.02}
    async with partitioned(dbs, **fast) as j:
        pids = [p.replace("route|", "pooled|") for p in PIDS[:20]]
        await j.persist_many([Write(p, [{"n": 1}]) for p in pids])
        seen: list[asyncpg.Record] = []

        async def handler(conn: asyncpg.Connection, envs: Sequence[object]) -> None:
            row = await conn.fetchrow("SELECT current_setting('application_name'), current_database()")
            seen.extend([row] * len(envs))

        w = Worker(j, j.settings, "p-home-pool", "pooled", handler, "grouped")
        task = asyncio.create_task(w.run())
        try:
            await wait_until(lambda: len(seen) >= len(pids), 30, "the projection")
        finally:
            w.stop()
            await task
        home = await stored(dbs[0], "SELECT current_setting('application_name'), current_database()")
        assert {tuple(r) for r in seen} == {(j.backend.shared_connections().application_name, home[0][1])}
        assert not await stored(dbs[0], "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE 'sj-projection%'")
        await j.persist("pooled|after", [{"n": 1}])  # the journal's pools stay open


async def test_sequenced_dead_letters_over_a_partitioned_journal(parts: list[str]) -> None:
    """``retry-and-dead-letter-sequenced`` over two databases: ids of both hold their later
    events behind their dead letters in the home database's table, and the retry drains each
    from the database that holds its events, in order."""
    from projections import Worker
    from projections.dead_letter_store import DeadLetterSql
    from projections.dead_letters import retry
    from projections.parked_store import ParkedSql
    from tests.sequenced_handler import CREATE, project, project_fixed
    from tests.support.waiting import wait_until

    dbs = parts[:2]
    fast = {"lease_ttl": 1.5, "lease_renew_interval": 0.3, "handler_backoff": 0.01, "handler_attempts": 2}
    pids = [p.replace("route|", "held|") for p in PIDS[:20]]
    poisoned = [p for p in pids if slice_for(p) < 512][:1] + [p for p in pids if slice_for(p) >= 512][:1]
    name, parked = "p-sequenced", ParkedSql("public")
    conn = await asyncpg.connect(asyncpg_dsn(dbs[0]))
    try:
        await conn.execute(CREATE)
        async with partitioned(dbs, **fast) as j:
            for n in range(1, 5):
                await j.persist_many([Write(p, [{"n": n, "poison": p in poisoned and n == 2}]) for p in pids])
            w = Worker(j, j.settings, name, "held", project, "grouped", recovery="retry-and-dead-letter-sequenced")
            task = asyncio.create_task(w.run())
            try:
                await wait_until(lambda: _applied_count(conn, 18 * 4 + 2), 30, "the free ids applied")
                await wait_until(lambda: parked.count(conn, name), 30, "parked events")
                assert await parked.count(conn, name) == 4
                result = await retry(j, conn, DeadLetterSql("public"), name, project_fixed, "grouped")
                assert sorted(result.drained) == sorted((p, n) for p in poisoned for n in (3, 4))
            finally:
                w.stop()
                await task
        rows = await conn.fetch("SELECT pid, array_agg(seq ORDER BY n) FROM seq_applied GROUP BY pid")
        assert {r[0]: r[1] for r in rows} == {p: [1, 2, 3, 4] for p in pids}
    finally:
        await conn.close()


async def _applied_count(conn: asyncpg.Connection, n: int) -> bool:
    return int(await conn.fetchval("SELECT count(*) FROM seq_applied")) == n
