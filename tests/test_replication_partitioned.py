"""Replication with a partitioned location: A over two databases, B on one (real servers).

A's logs keep their state in its home database and their events where their slices are
(``journal.partitioned.replication``). Checked: concurrent writes at both locations converge
(every event identity once at each, each pid in order, the same version vectors, A's events in
the database of their slice); a writer whose home transaction dies after its partitions
committed (the home server crashed in between) leaves events that the next writer adopts: no
position or identity used twice, nothing lost or doubled once replicated.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest
from endpoint_processes import free_address

from journal import Journal, JournalSettings, open_journal, slice_for
from journal.errors import ConfigurationError, JournalError, LocalWritesRefused
from journal.partitioned.backend import PartitionedBackend
from journal.partitioned.move import SliceMove
from journal.partitioned.replication import PartitionedReplicationStore
from journal.postgres import MOVING, OWNED, PostgresReplicationStore, asyncpg_dsn
from journal.replication.config import EndpointConfig
from journal.replication.endpoint import ReplicationEndpoint
from tests.partition_fixtures import running
from tests.support.private_server import crash
from tests.support.waiting import wait_until

LOG = "Ticket"


def pids(prefix: str, n: int) -> list[str]:
    """``n`` pids spread over the slices (both halves of a two-database layout)."""
    return [f"{LOG}|{prefix}{hashlib.sha1(bytes([i])).hexdigest()[:6]}" for i in range(n)]


def a_settings(databases: Sequence[str], home: str) -> JournalSettings:
    return JournalSettings.load(env={}, dsn=home, databases=list(databases))


async def fetch(dsn: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def stamped(dsns: Sequence[str]) -> list[asyncpg.Record]:
    """Every stamped event of the log in these databases."""
    out: list[asyncpg.Record] = []
    for d in dsns:
        out += await fetch(
            d,
            "SELECT persistence_id, seq_nr, slice, log_seq_nr, origin_location, origin_seq_nr FROM event_journal "
            "WHERE entity_type = $1 AND log_seq_nr IS NOT NULL",
            LOG,
        )
    return out


async def write_in_order(journal: Journal, ps: Sequence[str], n: int, tag: str, start: int = 0) -> None:
    """Each pid gets ``n`` events one after the other (v = tag-start ...); pids concurrently."""

    async def one(pid: str) -> None:
        for k in range(start, start + n):
            await journal.persist(pid, [{"v": f"{tag}-{k}"}])

    await asyncio.gather(*(one(p) for p in ps))


@contextlib.asynccontextmanager
async def endpoints(
    a: tuple[str, JournalSettings], b: tuple[str, JournalSettings]
) -> AsyncIterator[tuple[ReplicationEndpoint, ReplicationEndpoint]]:
    """A and B in this process, each pulling from the other."""
    address = {"A": free_address(), "B": free_address()}

    def config(name: str, dsn: str, other: str) -> EndpointConfig:
        return EndpointConfig.from_dict(
            {
                "location": name, "dsn": dsn, "listen": address[name], "logs": [LOG],
                "connections": [{"address": address[other]}], "retry_delay": 0.2, "failure_detection_limit": 2.0,
                "batch_size": 50,
            }
        )  # fmt: skip

    async with (
        ReplicationEndpoint(config("A", a[0], "B"), settings=a[1]) as ea,
        ReplicationEndpoint(config("B", b[0], "A"), settings=b[1]) as eb,
    ):
        yield ea, eb


async def converged(ea: ReplicationEndpoint, eb: ReplicationEndpoint, expected: int) -> bool:
    ids = [await e.store.event_ids(LOG) for e in (ea, eb)]
    return all(len(i) == expected for i in ids)


async def assert_converged(ea: ReplicationEndpoint, eb: ReplicationEndpoint, ps: Sequence[str], n: int) -> None:
    """Every identity once at both, each pid's events in the order written, equal version vectors."""
    ids = [await e.store.event_ids(LOG) for e in (ea, eb)]
    assert set(ids[0]) == set(ids[1])
    for i in ids:
        assert set(i.values()) == {1}, "an event is stored twice"
    assert await ea.store.version_vector(LOG) == await eb.store.version_vector(LOG)
    for e in (ea, eb):
        for pid in ps:
            got = [env.event["v"] async for env in e.journal.current_events_by_persistence_id(pid)]
            assert [int(v.rsplit("-", 1)[1]) for v in got] == list(range(n)), (e.config.location, pid, got)


def assert_positions_once(rows: Sequence[asyncpg.Record]) -> None:
    positions = [r["log_seq_nr"] for r in rows]
    assert len(positions) == len(set(positions)), "a log position is used twice"
    origin = [(r["origin_location"], r["origin_seq_nr"]) for r in rows]
    assert len(origin) == len(set(origin)), "an event identity is used twice"


@pytest.mark.timeout(120)
async def test_a_partitioned_location_replicates_with_a_single_database_one(parts: list[str]) -> None:
    a_dbs, b_db = parts[:2], parts[2]  # A: servers 0 and 1 (home: the first); B: server 2
    sa = a_settings(a_dbs, a_dbs[0])
    a_pids, b_pids = pids("a", 12), pids("b", 12)
    async with endpoints((a_dbs[0], sa), (b_db, JournalSettings.load(env={}, dsn=b_db))) as (ea, eb):
        assert isinstance(ea.store, PartitionedReplicationStore)
        assert isinstance(eb.store, PostgresReplicationStore)
        await asyncio.gather(write_in_order(ea.journal, a_pids, 5, "a"), write_in_order(eb.journal, b_pids, 5, "b"))
        await wait_until(lambda: converged(ea, eb, 120), 60, "convergence", every=0.2)
        await assert_converged(ea, eb, [*a_pids, *b_pids], 5)
        vv = await ea.store.version_vector(LOG)
        assert vv["A"] >= 60 and vv["B"] >= 60
    # A's events (its own and B's) each in the database of its slice, once, at distinct positions
    rows = await stamped(a_dbs)
    assert len(rows) == 120
    for dsn, (lo, hi) in zip(a_dbs, [(0, 511), (512, 1023)], strict=True):
        held = await stamped([dsn])
        assert held and all(lo <= r["slice"] <= hi for r in held), dsn
    assert {r["slice"] for r in rows} == {slice_for(p) for p in [*a_pids, *b_pids]}
    assert_positions_once(rows)
    home = await fetch(a_dbs[0], "SELECT log_seq_nr FROM replication_log WHERE log_name = $1", LOG)
    assert home[0][0] == max(r["log_seq_nr"] for r in rows)
    assert not await fetch(a_dbs[1], "SELECT 1 FROM replication_log")  # the log's state is at home only


@pytest.mark.timeout(120)
async def test_a_writer_that_dies_between_its_partitions_and_home_is_repaired(
    parts: list[str], pg_servers: list[Any]
) -> None:
    a_dbs, home, b_db = parts[:2], parts[2], parts[3]  # A: servers 0 and 1, home on server 2; B: server 0
    sa = a_settings(a_dbs, home)
    ps = pids("c", 10)
    async with open_journal(home, settings=sa, migrate=False) as journal:
        store = journal.backend.replication_store("A")
        assert isinstance(store, PartitionedReplicationStore)
        await store.ensure_log(LOG)
        await write_in_order(journal, ps, 3, "c")
        # hold one row of the second database: the stamp waits there with both parts' statements run
        victim = next(p for p in ps if slice_for(p) >= 512)
        blocker = await asyncpg.connect(asyncpg_dsn(a_dbs[1]))
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT 1 FROM event_journal WHERE persistence_id = $1 FOR UPDATE", victim)
        stamping = asyncio.create_task(store.stamp(LOG))

        async def waiting() -> bool:
            n = await blocker.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            return bool(n)

        await wait_until(waiting, 30, "the stamp waiting on the held row", every=0.05)
        crash(pg_servers[2])  # the home database goes: H cannot commit
        await tx.rollback()
        await blocker.close()
        with pytest.raises(JournalError):
            await stamping
        orphans = await stamped(a_dbs)
        assert len(orphans) == 30, "both partitions committed their stamps"
        await running(pg_servers[2])
        head = await fetch(home, "SELECT log_seq_nr FROM replication_log WHERE log_name = $1", LOG)
        assert [r[0] for r in head] == [0], "H did not commit"
        await write_in_order(journal, ps, 1, "c", start=3)  # each pid's 4th event

        async def stamp_all() -> bool:
            try:
                while await store.stamp(LOG):
                    pass
            except JournalError:
                return False  # the home pool reconnecting
            return True

        await wait_until(stamp_all, 30, "stamping after the home server is back", every=0.1)
        rows = await stamped(a_dbs)
        assert len(rows) == 40
        assert_positions_once(rows)
        assert await store.log_seq_nr(LOG) == max(r["log_seq_nr"] for r in rows) == 40
        assert (await store.version_vector(LOG))["A"] == 40
    # replicated: B gets each of A's events once, in each pid's order, and A gets B's
    sb = JournalSettings.load(env={}, dsn=b_db)
    async with endpoints((home, sa), (b_db, sb)) as (ea, eb):
        b_pids = pids("e", 4)
        await write_in_order(eb.journal, b_pids, 4, "e")
        await wait_until(lambda: converged(ea, eb, 56), 60, "convergence", every=0.2)
        await assert_converged(ea, eb, [*ps, *b_pids], 4)


@pytest.mark.timeout(120)
async def test_a_replicated_batch_whose_home_commit_failed_is_adopted_and_not_written_again(
    parts: list[str], pg_servers: list[Any]
) -> None:
    a_dbs, home, b_db = parts[:2], parts[2], parts[3]
    sa, sb = a_settings(a_dbs, home), JournalSettings.load(env={}, dsn=b_db)
    ps = pids("f", 8)
    async with open_journal(b_db, settings=sb, migrate=False) as jb:
        b = jb.backend.replication_store("B")
        await b.ensure_log(LOG)
        await write_in_order(jb, ps, 2, "f")
        assert await b.stamp(LOG) == 16
        events, last = await b.read_log(LOG, 0, 100)
        b_vv = await b.version_vector(LOG)
    async with open_journal(home, settings=sa, migrate=False) as journal:
        store = journal.backend.replication_store("A")
        await store.ensure_log(LOG)
        # an uncommitted row with the key of one of the batch's events: the batch's insert waits on it
        victim = next(p for p in ps if slice_for(p) >= 512)
        blocker = await asyncpg.connect(asyncpg_dsn(a_dbs[1]))
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute(
            "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, "
            "event_ser_manifest, event_payload, writer) VALUES ($1, $2, $3, 1, now(), 1, '', ''::bytea, 'test')",
            slice_for(victim), LOG, victim,
        )  # fmt: skip
        writing = asyncio.create_task(store.write_replicated(LOG, "B", events, last))

        async def waiting() -> bool:
            return bool(
                await blocker.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            )

        await wait_until(waiting, 30, "the batch waiting on the held key", every=0.05)
        crash(pg_servers[2])
        await tx.rollback()
        await blocker.close()
        with pytest.raises(JournalError):
            await writing
        assert len(await stamped(a_dbs)) == 16, "both partitions committed the batch"
        await running(pg_servers[2])

        async def write_again() -> Any:
            try:
                return await store.write_replicated(LOG, "B", events, last)
            except JournalError:
                return None  # the home pool reconnecting

        outcome = await wait_until(write_again, 30, "the batch written again", every=0.1)
        assert (outcome.written, outcome.dropped) == (0, 16)  # stored already: skipped by identity
        rows = await stamped(a_dbs)
        assert len(rows) == 16
        assert_positions_once(rows)
        # adopted: served by position and in the version vector (without the repair: neither)
        assert await store.log_seq_nr(LOG) == 16 and await store.progress(LOG, "B") == last
        got, _ = await store.read_log(LOG, 0, 100)
        assert sorted(e.event_id for e in got) == sorted(e.event_id for e in events)
        assert await store.version_vector(LOG) == b_vv


async def test_a_recovery_refuses_local_writes_on_every_database_and_keeps_moves_away(parts: list[str]) -> None:
    a_dbs = parts[:2]
    low, high = (next(p for p in pids("g", 40) if (slice_for(p) >= 512) == up) for up in (False, True))
    async with open_journal(a_dbs[0], settings=a_settings(a_dbs, a_dbs[0]), migrate=False) as journal:
        store = journal.backend.replication_store("A")
        await store.ensure_log(LOG)
        await journal.persist(low, [{"v": "g-0"}])
        await store.begin_recovery([LOG])
        assert await store.recovering([LOG]) and await store.guard_installed()
        for pid in (low, high):  # the home database and the other one
            with pytest.raises(LocalWritesRefused):
                await journal.persist(pid, [{"v": "g-1"}])
        assert await store.stamp(LOG) == 0  # nothing stamped while recovering
        with pytest.raises(ConfigurationError, match="replicated logs' state"):
            await SliceMove(journal.backend, 512, 767, parts[3]).run()  # the marker keeps a move away
        await store.end_recovery([LOG])
        assert not await store.recovering([LOG]) and not await store.guard_installed()
        await journal.persist(high, [{"v": "g-1"}])
        assert await store.stamp(LOG) == 2
        assert not await fetch(a_dbs[1], "SELECT 1 FROM replication_log")  # the marker is gone


async def test_a_range_being_moved_is_stamped_only_once_the_move_is_over(parts: list[str]) -> None:
    """A stamp changes rows a move's copy may have taken: a moving range's events wait."""
    a_dbs = parts[:2]
    spread = pids("h", 80)
    moving = [p for p in spread if 512 <= slice_for(p) <= 767][:3]
    others = [p for p in spread if slice_for(p) < 512 or slice_for(p) > 767][:3]
    async with open_journal(a_dbs[0], settings=a_settings(a_dbs, a_dbs[0]), migrate=False) as journal:
        backend = journal.backend
        assert isinstance(backend, PartitionedBackend)
        store = backend.replication_store("A")
        await store.ensure_log(LOG)
        await write_in_order(journal, [*moving, *others], 1, "h")
        second = backend.dbs.backends[1].partitions()
        await second.set_range(512, 767, MOVING, 1)  # as a move's first step records it
        await backend.dbs.reload()
        assert await store.stamp(LOG) == 3  # the other slices' events only
        assert {r["persistence_id"] for r in await stamped(a_dbs)} == set(others)
        await second.set_range(512, 767, OWNED, 1)  # the move abandoned: the range is owned again
        await backend.dbs.reload()
        assert await store.stamp(LOG) == 3
        rows = await stamped(a_dbs)
        assert {r["persistence_id"] for r in rows} == {*moving, *others}
        assert_positions_once(rows)
