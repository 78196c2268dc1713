"""One journal shared with a JVM service, proven with the real Akka Persistence R2DBC plugin.

The JVM side is ``interop/jvm`` (Akka Persistence R2DBC 1.1.2, Akka Projection R2DBC 1.4.0), run
as a subprocess against a PostgreSQL listening on a free TCP port (R2DBC needs TCP). Payloads are
JSON with serializer id 1 on both sides. Marked ``jvm``; skipped where java or mvn is missing,
except in CI (where ``.ci/run`` installs them).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from journal import Journal, JournalSettings, failures, open_journal
from journal.ids import slice_for
from journal.postgres import timestamp_rule
from journal.postgres.migrations import upgrade
from journal.write_validation import MAX_EVENTS_PER_CALL
from tests import jvm_driver
from tests.projection_helpers import FAST_ENV, stop
from tests.support.scratch import scratch_database
from tests.support.waiting import wait_until

# the first test builds interop/jvm (a cold Maven download on a fresh machine) in its setup
pytestmark = [pytest.mark.jvm, pytest.mark.timeout(1800)]

TYPE = "JvmCart"


@pytest.fixture(scope="session")
def jvm_classpath() -> str:
    why = jvm_driver.tools_missing()
    if why:
        if os.environ.get("CI"):
            raise RuntimeError(f"JVM interop tests cannot run in CI: {why}")
        pytest.skip(f"JVM interop tests need a JDK and Maven: {why}")
    return jvm_driver.build()


@pytest.fixture(scope="session")
def tcp_server(jvm_classpath: str) -> Iterator[jvm_driver.TcpServer]:
    with jvm_driver.tcp_postgres() as server:
        yield server


@pytest.fixture
def jvm_db(tcp_server: jvm_driver.TcpServer) -> Iterator[str]:
    """A fresh database migrated by this library (what ``journal migrate`` runs)."""
    with scratch_database(tcp_server.dsn(), "sjjvm") as db:
        upgrade(db)
        yield db


def _db_name(dsn: str) -> str:
    return dsn.rsplit("/", 1)[1].split("?")[0]


@pytest.fixture
def jvm(jvm_classpath: str, tcp_server: jvm_driver.TcpServer, jvm_db: str) -> jvm_driver.Jvm:
    return jvm_driver.Jvm(jvm_classpath, tcp_server, _db_name(jvm_db))


@pytest.fixture
async def pyj(jvm_db: str) -> AsyncIterator[Journal]:
    async with open_journal(jvm_db, settings=JournalSettings.load(env={}, dsn=jvm_db)) as j:
        yield j


def _micros(ts: datetime) -> int:
    return (ts - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


async def _collect(it: AsyncIterator[Any], n: int, within: float) -> list[Any]:
    out: list[Any] = []

    async def run() -> None:
        async for e in it:
            out.append(e)
            if len({(x.persistence_id, x.seq_nr) for x in out}) >= n:
                return

    await asyncio.wait_for(run(), within)
    return out


def _jvm_events(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [x for x in lines if "pid" in x]


# -- JVM writes, Python reads ------------------------------------------------------------------


async def test_jvm_writes_python_reads_current_and_live(jvm: jvm_driver.Jvm, pyj: Journal) -> None:
    entities, events = 6, 5
    live = asyncio.ensure_future(
        _collect(pyj.events_by_slices(TYPE, 0, 1023, mode="backtracking"), entities * events, 120)
    )
    [summary] = jvm.run("persist", **{"entity-type": TYPE, "prefix": "a", "entities": entities, "events": events})
    assert summary["written"] == entities * events
    current = [e async for e in pyj.current_events_by_slices(TYPE, 0, 1023, mode="backtracking")]
    seen = await live
    assert Counter((e.persistence_id, e.seq_nr) for e in current) == Counter(
        {(f"{TYPE}|a-{i}", n): 1 for i in range(entities) for n in range(1, events + 1)}
    )
    assert Counter((e.persistence_id, e.seq_nr) for e in seen) == Counter(
        (e.persistence_id, e.seq_nr) for e in current
    ), "live (backtracking mode) delivers every JVM event exactly once"
    for e in current:
        i = int(e.persistence_id.rsplit("-", 1)[1])
        assert e.event == {"writer": "jvm", "entity": i, "n": e.seq_nr}
        assert e.slice == slice_for(e.persistence_id)
        assert e.entity_type == TYPE
    # the plugin's own view of the same rows: same slices and db_timestamps
    by_jvm = {(x["pid"], x["seq_nr"]): x for x in _jvm_events(jvm.run("events-by-slices", **{"entity-type": TYPE}))}
    assert set(by_jvm) == {(e.persistence_id, e.seq_nr) for e in current}
    for e in current:
        x = by_jvm[(e.persistence_id, e.seq_nr)]
        assert (x["slice"], x["timestamp_micros"]) == (e.slice, _micros(e.db_timestamp))
        assert x["payload"] == e.event


async def test_python_recovers_what_the_jvm_wrote(jvm: jvm_driver.Jvm, pyj: Journal) -> None:
    jvm.run("persist", **{"entity-type": TYPE, "prefix": "r", "entities": 1, "events": 4})
    pid = f"{TYPE}|r-0"
    got = [e async for e in pyj.current_events_by_persistence_id(pid)]
    assert [(e.seq_nr, e.event) for e in got] == [(n, {"writer": "jvm", "entity": 0, "n": n}) for n in (1, 2, 3, 4)]
    # and Python continues the JVM entity's history where it stopped
    written = await pyj.persist(pid, [{"writer": "python", "n": 5}], expected_seq_nr=4)
    assert written[0].seq_nr == 5
    [state] = jvm.run("replay", pid=pid)
    assert state["seq_nr"] == 5
    assert state["state"]["events"][-1] == {"writer": "python", "n": 5}


# -- Python writes, JVM reads ------------------------------------------------------------------


async def test_python_writes_jvm_reads_current_live_and_replay(jvm: jvm_driver.Jvm, pyj: Journal) -> None:
    pids = [f"{TYPE}|py-{i}" for i in range(8)]
    live = jvm.start("events-by-slices", **{"entity-type": TYPE, "live": "true", "expect": 8 * 3, "timeout": 180})
    try:
        for n in (1, 2, 3):
            await asyncio.gather(*(pyj.persist(p, [{"writer": "python", "pid": p, "n": n}]) for p in pids))
        await asyncio.to_thread(live.wait_for, lambda ls: any(x.get("done") for x in ls), 180)
    finally:
        lines = live.stop()
    want = {(p, n) for p in pids for n in (1, 2, 3)}
    live_seen = _jvm_events(lines)
    assert {(x["pid"], x["seq_nr"]) for x in live_seen} == want, "the plugin's live eventsBySlices sees every event"
    current = _jvm_events(jvm.run("events-by-slices", **{"entity-type": TYPE}))
    assert Counter((x["pid"], x["seq_nr"]) for x in current) == Counter(want)
    rows = {(e.persistence_id, e.seq_nr): e async for e in pyj.current_events_by_slices(TYPE, 0, 1023)}
    for x in current:
        e = rows[(x["pid"], x["seq_nr"])]
        assert x["payload"] == {"writer": "python", "pid": x["pid"], "n": x["seq_nr"]}
        assert (x["slice"], x["timestamp_micros"], x["entity_type"]) == (e.slice, _micros(e.db_timestamp), TYPE)
    # a JVM entity recovers from events Python wrote, and goes on writing after them
    [state] = jvm.run("replay", pid=pids[0])
    assert state["seq_nr"] == 3
    assert state["state"]["events"] == [{"writer": "python", "pid": pids[0], "n": n} for n in (1, 2, 3)]


async def test_snapshots_cross_both_ways(jvm: jvm_driver.Jvm, pyj: Journal) -> None:
    # JVM writes a snapshot (every 3 events): Python reads it as JSON
    jvm.run("persist", **{"entity-type": TYPE, "prefix": "s", "entities": 1, "events": 3, "snapshot-every": 3})
    pid = f"{TYPE}|s-0"
    snap = await pyj.load_snapshot(pid)
    assert snap is not None and snap.seq_nr == 3
    assert snap.state == {"events": [{"writer": "jvm", "entity": 0, "n": n} for n in (1, 2, 3)]}
    # Python writes a snapshot the JVM entity recovers from: the state comes from the snapshot
    # (its marker is in no event), then the later events are replayed on top
    other = f"{TYPE}|s-py"
    await pyj.persist(other, [{"n": 1}, {"n": 2}])
    await pyj.save_snapshot(other, 2, {"events": [{"from": "python-snapshot"}]})
    await pyj.persist(other, [{"n": 3}])
    [state] = jvm.run("replay", pid=other)
    assert state["seq_nr"] == 3
    assert state["state"] == {"events": [{"from": "python-snapshot"}, {"n": 3}]}


# -- schemas -----------------------------------------------------------------------------------

DDL = jvm_driver.PROJECT / "ddl"


@pytest.fixture
def plugin_db(tcp_server: jvm_driver.TcpServer) -> Iterator[str]:
    """A fresh database created from the plugin's own DDL scripts (no migration of this library)."""
    with scratch_database(tcp_server.dsn(), "sjddl") as db:

        async def create() -> None:
            conn = await asyncpg.connect(db)
            try:
                for script in ("akka_persistence_r2dbc_1.1.2.sql", "akka_projection_r2dbc_1.4.0.sql"):
                    await conn.execute((DDL / script).read_text())
            finally:
                await conn.close()

        asyncio.run(create())
        yield db


def test_library_runs_on_the_plugins_ddl(jvm_classpath: str, tcp_server: jvm_driver.TcpServer, plugin_db: str) -> None:
    """The plugin's tables first (as a JVM team has them), then ``journal migrate`` adopts them:
    it keeps event_journal and snapshot as they are (rows included), adds the snapshot columns
    the 1.1.2 DDL lacks, and creates this library's own tables beside them."""
    jvm = jvm_driver.Jvm(jvm_classpath, tcp_server, _db_name(plugin_db))
    jvm.run("persist", **{"entity-type": TYPE, "prefix": "d", "entities": 3, "events": 2})

    async def sql(statement: str) -> Any:
        conn = await asyncpg.connect(plugin_db)
        try:
            return await conn.fetchval(statement)
        finally:
            await conn.close()

    asyncio.run(sql("DROP INDEX event_journal_slice_idx"))  # the plugin's DDL calls it optional
    journal_cli = str(Path(sys.executable).parent / "journal")
    subprocess.run([journal_cli, "migrate", "--dsn", plugin_db], check=True, timeout=120)

    async def python_side() -> tuple[list[Any], list[Any]]:
        async with open_journal(plugin_db, settings=JournalSettings.load(env={}, dsn=plugin_db), migrate=False) as j:
            await j.persist(f"{TYPE}|py-d", [{"writer": "python", "n": 1}, {"writer": "python", "n": 2}])
            by_slices = [e async for e in j.current_events_by_slices(TYPE, 0, 1023)]
            by_pid = [e async for e in j.current_events_by_persistence_id(f"{TYPE}|d-1")]
            await j.save_snapshot(f"{TYPE}|py-d", 2, {"events": [{"from": "python-snapshot"}]})
            return by_slices, by_pid

    by_slices, by_pid = asyncio.run(python_side())
    assert Counter((e.persistence_id, e.seq_nr) for e in by_slices) == Counter(
        [(f"{TYPE}|d-{i}", n) for i in range(3) for n in (1, 2)] + [(f"{TYPE}|py-d", 1), (f"{TYPE}|py-d", 2)]
    )
    assert [e.event for e in by_pid] == [{"writer": "jvm", "entity": 1, "n": n} for n in (1, 2)]
    jvm_seen = _jvm_events(jvm.run("events-by-slices", **{"entity-type": TYPE}))
    assert {(x["pid"], x["seq_nr"]) for x in jvm_seen} == {(e.persistence_id, e.seq_nr) for e in by_slices}
    assert asyncio.run(sql("SELECT to_regclass('event_journal_slice_idx') IS NOT NULL")), "migrate adds the index"
    assert asyncio.run(sql("SELECT count(*) FROM slice_journal_alembic_version")) == 1
    [state] = jvm.run("replay", pid=f"{TYPE}|py-d")
    assert state == {"pid": f"{TYPE}|py-d", "seq_nr": 2, "state": {"events": [{"from": "python-snapshot"}]}}


# -- both at once ------------------------------------------------------------------------------

SEEN_TABLES = """
CREATE TABLE jvm_projection_seen (projection_name text NOT NULL, persistence_id text NOT NULL,
  seq_nr bigint NOT NULL, payload text, PRIMARY KEY (projection_name, persistence_id, seq_nr));
CREATE TABLE py_projection_seen (persistence_id text NOT NULL, seq_nr bigint NOT NULL, payload jsonb,
  PRIMARY KEY (persistence_id, seq_nr));
"""


def spawn_python_projection(dsn: str, name: str, query_mode: str = "backtracking") -> subprocess.Popen[bytes]:
    """A Python projection worker (exactly-once, ``tests.jvm_handlers:record``) in its own process."""
    env = {
        **os.environ, **FAST_ENV, "JOURNAL_QUERY_MODE": query_mode,
        "PYTHONPATH": os.pathsep.join([str(jvm_driver.ROOT), os.environ.get("PYTHONPATH", "")]),
    }  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "projections", "run", name, "--entity-type", TYPE, "--handler",
         "tests.jvm_handlers:record", "--mode", "exactly-once", "--dsn", dsn, "--no-progress"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def _count(dsn: str, sql: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


async def _rows(dsn: str, sql: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(sql))
    finally:
        await conn.close()


async def test_both_write_at_once_and_both_projections_see_everything_once(
    jvm: jvm_driver.Jvm, pyj: Journal, jvm_db: str
) -> None:
    conn = await asyncpg.connect(jvm_db)
    await conn.execute(SEEN_TABLES)
    await conn.close()
    jvm_proj = jvm.start("project", name="jvm-proj", **{"entity-type": TYPE})
    py_proj = spawn_python_projection(jvm_db, "py-proj")
    try:
        await asyncio.to_thread(jvm_proj.wait_for, lambda ls: any("started" in x for x in ls), 120)
        entities, events = 8, 6
        py_pids = [f"{TYPE}|both-py-{i}" for i in range(entities)]

        async def python_writes() -> None:
            for n in range(1, events + 1):
                await asyncio.gather(*(pyj.persist(p, [{"writer": "python", "n": n}]) for p in py_pids))

        jvm_writes = {"entity-type": TYPE, "prefix": "both-jvm", "entities": entities, "events": events}
        await asyncio.gather(asyncio.to_thread(jvm.run, "persist", **jvm_writes), python_writes())
        total = 2 * entities * events
        try:
            await wait_until(
                lambda: _count(jvm_db, f"SELECT count(*) >= {total} FROM jvm_projection_seen"), 180, "JVM projection"
            )
        except AssertionError as e:
            raise AssertionError(f"{e}; JVM stderr:\n{jvm_proj.stderr()}") from None
        await wait_until(
            lambda: _count(jvm_db, f"SELECT count(*) >= {total} FROM py_projection_seen"), 180, "Python projection"
        )
    finally:
        jvm_lines = jvm_proj.stop()
        stop([py_proj])
    want = {(f"{TYPE}|both-{side}-{i}", n) for side in ("py", "jvm") for i in range(entities) for n in range(1, 7)}
    conn = await asyncpg.connect(jvm_db)
    try:
        jvm_rows = await conn.fetch("SELECT persistence_id, seq_nr, payload FROM jvm_projection_seen")
        py_rows = await conn.fetch("SELECT persistence_id, seq_nr, payload FROM py_projection_seen")
    finally:
        await conn.close()
    # the primary keys make a second delivery fail the handler: equal sets of equal size = exactly once
    assert {(r[0], r[1]) for r in jvm_rows} == want and len(jvm_rows) == len(want)
    assert {(r[0], r[1]) for r in py_rows} == want and len(py_rows) == len(want)
    assert all(r[2] is not None for r in [*jvm_rows, *py_rows]), "every payload decoded on both sides"
    assert Counter((x["pid"], x["seq_nr"]) for x in _jvm_events(jvm_lines)) == Counter(want)


async def test_the_plugins_projection_and_current_query_read_bursts_and_the_largest_call(
    jvm: jvm_driver.Jvm, pyj: Journal, jvm_db: str
) -> None:
    """Group commit writes up to 2,000 rows per statement and one call may hold 10,000 events;
    the plugin pages 1,000 rows by timestamp and stalls for ever on a timestamp that holds more
    ("Too many events stored with the same timestamp"). With rows stamped one microsecond apart
    its exactly-once projection (live) and currentEventsBySlices read every event once."""
    conn = await asyncpg.connect(jvm_db)
    await conn.execute(SEEN_TABLES)
    await timestamp_rule.install(conn)  # the shared deployment: the rule for the JVM's writes
    await conn.close()
    jvm_proj = jvm.start("project", name="bursts", **{"entity-type": TYPE})
    want: set[tuple[str, int]] = set()
    try:
        await asyncio.to_thread(jvm_proj.wait_for, lambda ls: any("started" in x for x in ls), 120)
        # (i) a burst of concurrent single-event calls (group-commit batches)
        await asyncio.gather(*(pyj.persist(f"{TYPE}|burst-{i}", [{"n": i}]) for i in range(1500)))
        want |= {(f"{TYPE}|burst-{i}", 1) for i in range(1500)}
        # (ii) persist_many of thousands of parts
        assert failures(await pyj.persist_many([(f"{TYPE}|many-{i}", [{"n": i}]) for i in range(2000)])) == []
        want |= {(f"{TYPE}|many-{i}", 1) for i in range(2000)}
        # (iii) one call of the largest allowed size
        await pyj.persist(f"{TYPE}|largest", [{"n": n} for n in range(MAX_EVENTS_PER_CALL)])
        want |= {(f"{TYPE}|largest", n) for n in range(1, MAX_EVENTS_PER_CALL + 1)}
        try:
            await wait_until(
                lambda: _count(jvm_db, f"SELECT count(*) >= {len(want)} FROM jvm_projection_seen"),
                240, "the plugin's projection to read every event",
            )  # fmt: skip
        except AssertionError as e:
            raise AssertionError(f"{e}; JVM stderr:\n{jvm_proj.stderr()[-3000:]}") from None
    finally:
        jvm_proj.stop()
    rows = await _rows(jvm_db, "SELECT persistence_id, seq_nr FROM jvm_projection_seen")
    # the primary key makes a second delivery fail the handler: equal sets of equal size = exactly once
    assert {(r[0], r[1]) for r in rows} == want and len(rows) == len(want)
    current = _jvm_events(jvm.run("events-by-slices", **{"entity-type": TYPE}))
    assert Counter((x["pid"], x["seq_nr"]) for x in current) == Counter(dict.fromkeys(want, 1))


# -- horizon mode with foreign writers ---------------------------------------------------------


@pytest.mark.parametrize("rule", [False, True], ids=["without-rule", "with-rule"])
async def test_horizon_mode_with_a_jvm_writer_stalled_after_its_timestamp(
    rule: bool, jvm_classpath: str, tcp_server: jvm_driver.TcpServer, jvm_db: str, pyj: Journal
) -> None:
    """The adversary: the plugin's atomic write of 2 events sends BEGIN (its db_timestamp is
    ``transaction_timestamp()``, fixed now), then the proxy holds its INSERT. Meanwhile Python
    writes an event and a horizon-mode live query delivers it. Then the JVM insert goes on.

    Without the rule the JVM rows land *below* an event already delivered and horizon mode never
    delivers them (the counterexample, asserted). With ``journal timestamp-rule install`` the
    trigger stamps them inside the insert, after the lock, and they are delivered exactly once."""
    if rule:
        conn = await asyncpg.connect(jvm_db)
        await timestamp_rule.install(conn)
        assert await timestamp_rule.installed(conn)
        await conn.close()
    proxy = jvm_driver.StallingProxy(tcp_server)
    jvm = jvm_driver.Jvm(jvm_classpath, proxy.server, _db_name(jvm_db))
    got: list[Any] = []

    async def read() -> None:
        async for e in pyj.events_by_slices(TYPE, 0, 1023, mode="horizon"):
            got.append(e)

    def delivered(pid: str, seq_nr: int) -> Any:
        async def check() -> bool:
            return any((e.persistence_id, e.seq_nr) == (pid, seq_nr) for e in got)

        return check

    reader = asyncio.ensure_future(read())
    try:
        proxy.arm()
        writes = {"entity-type": TYPE, "prefix": "stall", "entities": 1, "events": 2, "per-call": 2}
        jvm_write = asyncio.ensure_future(asyncio.to_thread(jvm.run, "persist", **writes))
        assert await asyncio.to_thread(proxy.stalled.wait, 120), "the JVM write never reached its INSERT"
        first = await pyj.persist(f"{TYPE}|py-after", [{"n": 1}])
        await wait_until(delivered(f"{TYPE}|py-after", 1), 60, "the Python event written during the stall")
        proxy.release.set()
        await jvm_write
        await pyj.persist(f"{TYPE}|py-after", [{"n": 2}])
        await wait_until(delivered(f"{TYPE}|py-after", 2), 60, "the Python event written after the JVM's")
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        proxy.close()
    jvm_rows = [e async for e in pyj.current_events_by_persistence_id(f"{TYPE}|stall-0")]
    assert [e.seq_nr for e in jvm_rows] == [1, 2]
    seen = Counter((e.persistence_id, e.seq_nr) for e in got)
    if rule:
        assert all(e.db_timestamp > first[0].db_timestamp for e in jvm_rows)
        assert seen == Counter({(f"{TYPE}|py-after", 1): 1, (f"{TYPE}|stall-0", 1): 1, (f"{TYPE}|stall-0", 2): 1,
                                (f"{TYPE}|py-after", 2): 1})  # fmt: skip
    else:
        assert all(e.db_timestamp < first[0].db_timestamp for e in jvm_rows), "stamped at BEGIN, before the stall"
        assert seen[(f"{TYPE}|stall-0", 1)] == seen[(f"{TYPE}|stall-0", 2)] == 0, "horizon mode missed them"


# -- taking over a JVM projection --------------------------------------------------------------


async def test_python_worker_takes_over_a_jvm_projection(jvm: jvm_driver.Jvm, pyj: Journal, jvm_db: str) -> None:
    """The plugin's offset store is this library's table (same columns; the JVM side is configured
    with its name): a projection that ran on the JVM is continued by a Python worker from the
    stored offsets, processing nothing twice and missing nothing."""
    conn = await asyncpg.connect(jvm_db)
    await conn.execute(SEEN_TABLES)
    await conn.close()
    # batch 1, written by both sides, handled by the JVM projection "carts"
    jvm.run("persist", **{"entity-type": TYPE, "prefix": "t-jvm", "entities": 6, "events": 3})
    for n in (1, 2, 3):
        await asyncio.gather(*(pyj.persist(f"{TYPE}|t-py-{i}", [{"writer": "python", "n": n}]) for i in range(6)))
    batch1 = {(f"{TYPE}|t-{side}-{i}", n) for side in ("jvm", "py") for i in range(6) for n in (1, 2, 3)}
    jvm_proj = jvm.start("project", name="carts", **{"entity-type": TYPE})
    try:
        await asyncio.to_thread(
            jvm_proj.wait_for, lambda ls: {(x["pid"], x["seq_nr"]) for x in _jvm_events(ls)} >= batch1, 180
        )
    finally:
        jvm_proj.stop()
    stored = await _count(
        jvm_db, "SELECT count(*) FROM projection_timestamp_offset_store WHERE projection_name = 'carts'"
    )
    assert stored > 0, "the JVM projection stored its offsets in this library's offset table"
    # batch 2 (more events of the same pids and new pids), then a Python worker takes over "carts"
    jvm.run("persist", **{"entity-type": TYPE, "prefix": "t-jvm", "entities": 8, "events": 2})  # 0-5: seq 4-5
    for n in (4, 5):
        await asyncio.gather(*(pyj.persist(f"{TYPE}|t-py-{i}", [{"writer": "python", "n": n}]) for i in range(6)))
    batch2 = {(f"{TYPE}|t-jvm-{i}", n) for i in range(6) for n in (4, 5)}
    batch2 |= {(f"{TYPE}|t-jvm-{i}", n) for i in (6, 7) for n in (1, 2)}
    batch2 |= {(f"{TYPE}|t-py-{i}", n) for i in range(6) for n in (4, 5)}
    worker = spawn_python_projection(jvm_db, "carts")
    try:
        await wait_until(
            lambda: _count(jvm_db, f"SELECT count(*) >= {len(batch2)} FROM py_projection_seen"), 180, "the takeover"
        )
        # let the worker run on past the last event: nothing more may arrive
        await pyj.persist(f"{TYPE}|t-marker", [{"n": 1}])
        await wait_until(
            lambda: _count(
                jvm_db, f"SELECT count(*) > 0 FROM py_projection_seen WHERE persistence_id = '{TYPE}|t-marker'"
            ),
            120,
            "the marker event",
        )
    finally:
        stop([worker])
    rows = await _rows(jvm_db, "SELECT persistence_id, seq_nr FROM py_projection_seen")
    got = Counter((r[0], r[1]) for r in rows)
    assert set(got) == batch2 | {(f"{TYPE}|t-marker", 1)}, "nothing of batch 1 again, nothing of batch 2 missed"
    assert max(got.values()) == 1


async def test_jvm_projection_takes_over_a_python_projection(jvm: jvm_driver.Jvm, pyj: Journal, jvm_db: str) -> None:
    """The other direction: a Python worker's offsets (including its heartbeat rows, pid '' and
    seq_nr 0) are continued by the plugin's R2dbcProjection of the same name."""
    conn = await asyncpg.connect(jvm_db)
    await conn.execute(SEEN_TABLES)
    await conn.close()
    jvm.run("persist", **{"entity-type": TYPE, "prefix": "u-jvm", "entities": 4, "events": 3})
    for n in (1, 2, 3):
        await asyncio.gather(*(pyj.persist(f"{TYPE}|u-py-{i}", [{"writer": "python", "n": n}]) for i in range(4)))
    worker = spawn_python_projection(jvm_db, "orders")
    try:
        await wait_until(lambda: _count(jvm_db, "SELECT count(*) >= 24 FROM py_projection_seen"), 180, "batch 1")
        # wait for a heartbeat offset row too, so the JVM meets one
        await wait_until(
            lambda: _count(
                jvm_db,
                "SELECT count(*) > 0 FROM projection_timestamp_offset_store "
                "WHERE projection_name = 'orders' AND persistence_id = ''",
            ),
            60,
            "a heartbeat offset row",
        )
    finally:
        stop([worker])
    jvm.run("persist", **{"entity-type": TYPE, "prefix": "u-jvm", "entities": 5, "events": 2})
    for n in (4, 5):
        await asyncio.gather(*(pyj.persist(f"{TYPE}|u-py-{i}", [{"writer": "python", "n": n}]) for i in range(4)))
    batch2 = {(f"{TYPE}|u-jvm-{i}", n) for i in range(4) for n in (4, 5)}
    batch2 |= {(f"{TYPE}|u-jvm-4", n) for n in (1, 2)} | {(f"{TYPE}|u-py-{i}", n) for i in range(4) for n in (4, 5)}
    jvm_proj = jvm.start("project", name="orders", **{"entity-type": TYPE})
    try:
        await wait_until(
            lambda: _count(jvm_db, f"SELECT count(*) >= {len(batch2)} FROM jvm_projection_seen"), 180, "the takeover"
        )
        await pyj.persist(f"{TYPE}|u-marker", [{"n": 1}])
        await wait_until(
            lambda: _count(
                jvm_db, f"SELECT count(*) > 0 FROM jvm_projection_seen WHERE persistence_id = '{TYPE}|u-marker'"
            ),
            120,
            "the marker event",
        )
    except AssertionError as e:
        raise AssertionError(f"{e}; JVM stderr:\n{jvm_proj.stderr()}") from None
    finally:
        jvm_proj.stop()
    rows = await _rows(jvm_db, "SELECT persistence_id, seq_nr FROM jvm_projection_seen")
    got = Counter((r[0], r[1]) for r in rows)
    assert set(got) == batch2 | {(f"{TYPE}|u-marker", 1)}, "nothing of batch 1 again, nothing of batch 2 missed"
    assert max(got.values()) == 1


# -- durable state, both ways ------------------------------------------------------------------

STATE_TYPE = "JvmProfile"


async def test_durable_state_crosses_both_ways_with_its_revisions(jvm: jvm_driver.Jvm, pyj: Journal) -> None:
    """The plugin's R2dbcDurableStateStore and ``journal.durable_state()`` on one ``durable_state``
    table: a JVM state is read here and its revision continued, a state upserted here is read by
    the JVM's getObject and continued there, and each side's changes by slices see the other's."""
    store = pyj.durable_state()
    pid = f"{STATE_TYPE}|a"
    for rev in (1, 2):
        jvm.run("state-upsert", pid=pid, revision=rev, value=f'{{"writer":"jvm","rev":{rev}}}')
    got = await store.get(pid)
    assert got is not None and (got.revision, got.value, got.deleted) == (2, {"writer": "jvm", "rev": 2}, False)
    await store.upsert(pid, 3, {"writer": "python", "rev": 3})
    [seen] = jvm.run("state-get", pid=pid)
    assert (seen["revision"], seen["value"]) == (3, {"writer": "python", "rev": 3})
    jvm.run("state-upsert", pid=pid, revision=4, value='{"writer":"jvm","rev":4}')  # the JVM continues ours
    with pytest.raises(jvm_driver.JvmError):  # and the plugin refuses a revision Python already wrote
        jvm.run("state-upsert", pid=pid, revision=4, value='{"writer":"jvm","rev":"again"}')
    got = await store.get(pid)
    assert got is not None and (got.revision, got.value) == (4, {"writer": "jvm", "rev": 4})

    py_pids = [f"{STATE_TYPE}|py-{i}" for i in range(5)]
    await store.upsert_many([(p, 1, {"writer": "python", "i": i}) for i, p in enumerate(py_pids)])
    await store.upsert(py_pids[0], 2, {"writer": "python", "i": 0, "rev": 2})
    await store.delete(py_pids[1], 2)
    [gone] = jvm.run("state-get", pid=py_pids[1])
    assert (gone["revision"], gone["value"]) == (2, None), "the plugin reads our tombstone as a deleted state"

    by_jvm = jvm.run("state-changes", **{"entity-type": STATE_TYPE})
    assert by_jvm[-1] == {"done": 6}
    changes = {x["pid"]: x for x in by_jvm[:-1]}
    assert set(changes) == {pid, *py_pids}, "the plugin's changes by slices: each pid once, at its latest revision"
    assert (changes[pid]["revision"], changes[py_pids[0]]["revision"]) == (4, 2)
    assert changes[py_pids[0]]["value"] == {"writer": "python", "i": 0, "rev": 2}
    assert changes[py_pids[1]] == {"pid": py_pids[1], "revision": 2, "deleted": True}
    ours = [c async for c in store.current_changes_by_slices(STATE_TYPE, 0, 1023, mode="backtracking")]
    assert {(c.persistence_id, c.revision) for c in ours} == {(p, x["revision"]) for p, x in changes.items()}


async def test_tags_written_by_the_plugin_are_seen_by_events_by_tag(jvm: jvm_driver.Jvm, jvm_db: str) -> None:
    """The plugin stores an event's tags in its row and has no tag view; with `journal
    timestamp-rule install` (the shared deployment's rule) the database writes their tag rows, so
    events_by_tag sees the JVM's tagged events beside this library's, each once, in per-pid order.
    Before: the JVM's tagged events were never seen by events_by_tag."""
    conn = await asyncpg.connect(jvm_db)
    try:
        await timestamp_rule.install(conn)
    finally:
        await conn.close()
    jvm.run("persist", **{"entity-type": TYPE, "prefix": "tagged", "entities": 3, "events": 4, "tag": "jvm-tag"})
    fast = JournalSettings.load(env={}, dsn=jvm_db, eventual_consistency_delay=0.0)
    async with open_journal(jvm_db, settings=fast) as j:
        await j.persist(f"{TYPE}|tagged-py", [{"n": 1}, {"n": 2}], tags=["jvm-tag"])
        got = [(e.persistence_id, e.seq_nr, e.event) async for e in j.current_events_by_tag("jvm-tag")]
    want = {(f"{TYPE}|tagged-{i}", n) for i in range(3) for n in range(1, 5)} | {
        (f"{TYPE}|tagged-py", 1),
        (f"{TYPE}|tagged-py", 2),
    }
    assert Counter((p, s) for p, s, _ in got) == Counter(dict.fromkeys(want, 1))
    for pid in {p for p, _, _ in got}:
        assert [s for p, s, _ in got if p == pid] == sorted(s for p, s, _ in got if p == pid)
    for p, s, e in got:
        if not p.endswith("-py"):
            assert e == {"writer": "jvm", "entity": int(p.rsplit("-", 1)[1]), "n": s}


BEHAVIOR_TYPE = "JvmWallet"


def _projected(lines: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(x["projected"], x["revision"]) for x in lines if "projected" in x]


async def test_a_durable_state_behavior_both_ways_and_the_plugins_changes_projection(
    jvm: jvm_driver.Jvm, pyj: Journal, jvm_db: str
) -> None:
    """One JVM (``state-session``): a typed DurableStateBehavior (interop.StateEntity) and an
    exactly-once R2dbcProjection over the plugin's DurableStateSourceProvider.changesBySlices,
    whose handler inserts each (pid, revision) under a primary key. The behaviour's state is read
    here and its revision continued; states upserted here are recovered by the behaviour, which
    continues their revisions (and deletes one, which this library continues); the projection
    sees every pid's latest revision, this library's included, each revision once, also across a
    restart from its stored offsets."""
    conn = await asyncpg.connect(jvm_db)
    try:
        await conn.execute(
            "CREATE TABLE jvm_state_seen (projection_name text NOT NULL, persistence_id text NOT NULL,"
            " revision bigint NOT NULL, value text, deleted boolean NOT NULL,"
            " PRIMARY KEY (projection_name, persistence_id, revision))"
        )
    finally:
        await conn.close()
    store = pyj.durable_state()
    a, b, c = (f"{BEHAVIOR_TYPE}|{x}" for x in "abc")
    session = jvm.start("state-session", name="jvm-wallets", **{"entity-type": BEHAVIOR_TYPE})

    def projected(pid: str, revision: int) -> None:
        session.wait_for(lambda lines: (pid, revision) in _projected(lines), 120)

    try:
        session.wait_for(lambda lines: any("started" in x for x in lines), 120)
        assert [session.ask(op="put", pid=a, value={"writer": "jvm", "n": n})["revision"] for n in (1, 2)] == [1, 2]
        got = await store.get(a)
        assert got is not None and (got.revision, got.value) == (2, {"writer": "jvm", "n": 2})
        await store.upsert(a, 3, {"writer": "python", "n": 3})  # ours continues the behaviour's
        await store.upsert_many([(b, 1, {"writer": "python", "n": 1}), (c, 1, {"writer": "python", "n": 1})])
        await store.upsert(b, 2, {"writer": "python", "n": 2})
        projected(a, 3)  # the plugin's projection sees this library's revision

        recovered = session.ask(op="recover", pid=a)
        assert (recovered["revision"], recovered["value"]) == (3, {"writer": "python", "n": 3})
        assert session.ask(op="recover", pid=b)["revision"] == 2
        assert session.ask(op="put", pid=a, value={"writer": "jvm", "n": 4})["revision"] == 4  # and continued
        assert session.ask(op="delete", pid=c)["revision"] == 2  # the behaviour recovered c at 1, deleted it
        gone = await store.get(c)
        assert gone is not None and (gone.revision, gone.deleted, gone.value) == (2, True, None)
        await store.upsert(c, 3, {"writer": "python", "n": 3})  # ours continues after the plugin's tombstone
        for pid, revision in ((a, 4), (b, 2), (c, 3)):
            projected(pid, revision)

        session.ask(op="restart-projection")  # from its stored offsets: nothing seen again
        await store.upsert(b, 3, {"writer": "python", "n": 3})
        projected(b, 3)
        assert session.ask(op="recover", pid=b)["value"] == {"writer": "python", "n": 3}
    finally:
        lines = session.stop()
    seen = _projected(lines)
    assert max(Counter(seen).values()) == 1, f"a revision projected twice: {seen}"
    for pid in (a, b, c):
        revisions = [r for p, r in seen if p == pid]
        assert revisions == sorted(revisions), f"{pid}'s revisions went backwards in the projection: {revisions}"
    rows = await _rows(jvm_db, "SELECT persistence_id, revision, value, deleted FROM jvm_state_seen")
    assert sorted((r[0], r[1]) for r in rows) == sorted(seen), "every projected revision committed with it"
    last = {r[0]: r for r in rows if r[1] == max(x[1] for x in rows if x[0] == r[0])}
    assert {p: (r[1], r[2] and json.loads(r[2])) for p, r in last.items()} == {
        a: (4, {"writer": "jvm", "n": 4}),
        b: (3, {"writer": "python", "n": 3}),
        c: (3, {"writer": "python", "n": 3}),
    }
    assert (c, 2) not in seen or next(r[3] for r in rows if (r[0], r[1]) == (c, 2)), "a delete is a deleted change"
