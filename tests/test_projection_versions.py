"""Projection versions (issue 36 item 1): a version 2 catches up into its own schema while version
1 serves, ``projections switch`` swaps the readers' views atomically, version 1's workers stop.
Real PostgreSQL, real worker processes, kill -9 of workers and of the switch, a reader loop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg
import pytest
from projection_helpers import FAST_ENV, spawn_worker, stop
from version_handlers import table_of

from journal import Journal
from journal.settings import JournalSettings
from projections.postgres_store import HEARTBEAT_PID, OffsetRow, ProjectionSql
from projections.version_store import VersionSql
from projections.versions import list_versions, register_on
from tests.support.waiting import wait_until

V1 = "tests.version_handlers:totals_v1"
V2 = "tests.version_handlers:totals_v2"


@dataclass
class Case:
    """One test's projection: fresh names (version schemas outlive the journal's truncation)."""

    et: str = field(default_factory=lambda: f"Vt{uuid.uuid4().hex[:8]}")

    @property
    def name(self) -> str:
        return f"v-{self.et.lower()}"

    @property
    def table(self) -> str:
        return table_of(self.et)

    def schema(self, version: int) -> str:
        return f"{self.name}@{version}"


@pytest.fixture
async def conn(journal: Journal, dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    yield c
    await c.close()


async def cli(dsn: str, *args: str) -> tuple[int, str, str]:
    p = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "projections", *args, "--dsn", dsn, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, **FAST_ENV},
    )  # fmt: skip
    out, err = await p.communicate()
    assert p.returncode is not None
    return p.returncode, out.decode(), err.decode()


async def events_in(conn: asyncpg.Connection, relation: str) -> int | None:
    """Events counted by a read model (a version's table or the readers' view); None: none yet."""
    try:
        return int(await conn.fetchval(f"SELECT coalesce(sum(events), 0) FROM {relation}"))
    except asyncpg.UndefinedTableError:
        return None


async def has(conn: asyncpg.Connection, relation: str, n: int) -> bool:
    got = await events_in(conn, relation)
    return got is not None and got >= n


async def write(journal: Journal, et: str, pids: int, each: int) -> int:
    for p in range(pids):
        await journal.persist(f"{et}|{p}", [{"n": i} for i in range(each)])
    return pids * each


async def states(conn: asyncpg.Connection, c: Case) -> dict[int, str]:
    return {v.version: v.state for v in await _versions(conn, c)}


async def _versions(conn: asyncpg.Connection, c: Case) -> list[object]:
    from projections.versions import listed

    return list(await listed(conn, VersionSql("public"), c.name))


async def view_source(conn: asyncpg.Connection, c: Case) -> list[str]:
    """The version schemas the readers' view reads."""
    return list(await VersionSql("public").views_over(conn, [c.schema(1)])) + [
        f"2:{v}" for v in await VersionSql("public").views_over(conn, [c.schema(2)])
    ]


class Writer:
    """Writes events one persist at a time until stopped (the load during a rebuild)."""

    def __init__(self, journal: Journal, et: str) -> None:
        self.journal, self.et, self.written, self._stop = journal, et, 0, asyncio.Event()

    async def run(self) -> None:
        while not self._stop.is_set():
            await self.journal.persist(f"{self.et}|w{self.written % 20}", [{"n": self.written}])
            self.written += 1
            await asyncio.sleep(0.002)  # a paced load, not a race's cover

    def stop(self) -> None:
        self._stop.set()


class Reader:
    """Queries the readers' view in a loop: every failure and every step back is kept."""

    def __init__(self, dsn: str, view: str) -> None:
        self.dsn, self.view = dsn, view
        self.reads, self.best, self.slowest = 0, -1, 0.0
        self.failures: list[str] = []
        self.steps_back: list[tuple[int, int]] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    n = int(await conn.fetchval(f"SELECT coalesce(sum(events), 0) FROM {self.view}"))
                except (asyncpg.PostgresError, OSError) as e:
                    self.failures.append(repr(e))
                    continue
                self.slowest = max(self.slowest, time.monotonic() - started)
                if n < self.best:
                    self.steps_back.append((self.best, n))
                self.best, self.reads = max(self.best, n), self.reads + 1
                await asyncio.sleep(0.003)
        finally:
            await conn.close()

    def stop(self) -> None:
        self._stop.set()


async def test_rebuild_and_switch_under_readers_and_load(journal: Journal, conn: asyncpg.Connection, dsn: str) -> None:
    c = Case()
    written = await write(journal, c.et, 20, 50)
    procs = [spawn_worker(dsn, c.name, c.et, V1, extra=["--version", "1"])]
    try:
        await wait_until(lambda: has(conn, f'"{c.schema(1)}".{c.table}', written), 60, "version 1 caught up")
        rc, out, err = await cli(dsn, "switch", c.name, "1")
        assert rc == 0, err
        assert out.startswith(f"version 1 of {c.name} serves (no version before): views {c.table}"), out
        reader, writer = Reader(dsn, f"public.{c.table}"), Writer(journal, c.et)
        tasks = [asyncio.create_task(reader.run()), asyncio.create_task(writer.run())]
        procs.append(spawn_worker(dsn, c.name, c.et, V2, extra=["--version", "2"]))
        await wait_until(lambda: has(conn, f'"{c.schema(2)}".{c.table}', written), 60, "version 2 catching up")
        assert await states(conn, c) == {1: "serving", 2: "building"}
        reads_before = reader.reads
        started = time.monotonic()
        rc, out, err = await cli(dsn, "switch", c.name, "2", "--wait", "30")
        assert rc == 0, err
        print(f"switch command {time.monotonic() - started:.3f} s;", end=" ")
        assert out.startswith(f"version 2 of {c.name} serves (version 1 before)"), out
        assert await states(conn, c) == {1: "retired", 2: "serving"}
        # version 1's worker sees it is no longer current and stops by itself (exit 0)
        await wait_until(lambda: procs[0].poll() is not None, 30, "version 1's worker to stop")
        assert procs[0].returncode == 0
        await wait_until(lambda: reader.reads > reads_before + 20, 30, "reads after the switch")
        writer.stop()
        await tasks[1]
        total = written + writer.written
        await wait_until(lambda: has(conn, f"public.{c.table}", total), 60, "the view to show every event")
        # the reader's own loop must have read the whole model too before it stops (it reads
        # every 3 ms; stopping it as soon as the view shows the total raced its next read)
        await wait_until(
            lambda: reader.best == total or reader.failures or reader.steps_back, 30, "the reader's read of every event"
        )
        reader.stop()
        await tasks[0]
        assert reader.failures == [] and reader.steps_back == [], (reader.failures[:3], reader.steps_back[:3])
        assert reader.best == total and reader.reads > 50
        print(f"{reader.reads} reads through the rebuild and switch, slowest {reader.slowest * 1000:.1f} ms")
        # the view now reads version 2's table, with its extra column
        assert await conn.fetchval(f"SELECT max(last_seq_nr) FROM public.{c.table}") >= 50
        rc, out, err = await cli(dsn, "status", c.name, "--json")
        assert rc == 0, err
        shown = {p["name"]: p["version"]["state"] for p in json.loads(out)}
        assert shown == {f"{c.name}@1": "retired", f"{c.name}@2": "serving"}
        rc, out, err = await cli(dsn, "status", c.name)
        assert rc == 0, err
        assert f"{c.name}@2: version 2 of {c.name}, serving, tables in schema {c.name}@2\n" in out, out
        assert f"{c.name}@1: version 1 of {c.name}, retired" in out, out
        rc, out, err = await cli(dsn, "drop-version", c.name, "1")
        assert rc == 0, err
        assert await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = $1", c.schema(1)) == 0
        assert await ProjectionSql("public").projection_names(conn) == [f"{c.name}@2"]
        assert await events_in(conn, f"public.{c.table}") == total  # readers unaffected
    finally:
        stop(procs)
        await _drop(conn, c)


async def test_kill9_during_catch_up_then_restart(journal: Journal, conn: asyncpg.Connection, dsn: str) -> None:
    c = Case()
    written = await write(journal, c.et, 40, 100)
    slow = {"JOURNAL_PROJECTION_GROUP_SIZE": "20"}  # many small batches: the kill lands mid catch-up
    procs = [spawn_worker(dsn, c.name, c.et, V1, extra=["--version", "1"])]
    try:
        procs.append(spawn_worker(dsn, c.name, c.et, V1, extra=["--version", "2"], env=slow))
        v2 = f'"{c.schema(2)}".{c.table}'
        await wait_until(lambda: has(conn, v2, 200), 60, "version 2 under way")
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        at_kill = await events_in(conn, v2)
        assert at_kill is not None and at_kill < written, f"the kill came after the catch-up ({at_kill})"
        procs.append(spawn_worker(dsn, c.name, c.et, V1, extra=["--version", "2"], env=slow))
        await wait_until(lambda: has(conn, v2, written), 90, "version 2 to catch up after the restart")
        await wait_until(lambda: has(conn, f'"{c.schema(1)}".{c.table}', written), 60, "version 1 caught up")
        one = await conn.fetch(f'SELECT pid, events FROM "{c.schema(1)}".{c.table} ORDER BY pid')
        two = await conn.fetch(f"SELECT pid, events FROM {v2} ORDER BY pid")
        assert [tuple(r) for r in two] == [tuple(r) for r in one] and len(one) == 40
        assert sum(r["events"] for r in two) == written  # nothing twice, nothing lost
    finally:
        stop(procs)
        await _drop(conn, c)


async def _switch_waiting(conn: asyncpg.Connection) -> bool:
    """A switch is in its transaction, holding version 1's commits while it waits for version 2."""
    n = await conn.fetchval(
        """SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid()
AND state IN ('active', 'idle in transaction') AND query LIKE '%GROUP BY slice, persistence_id%'"""
    )
    return bool(n)


async def test_kill9_during_the_switch_is_all_or_nothing(journal: Journal, conn: asyncpg.Connection, dsn: str) -> None:
    c = Case()
    written = await write(journal, c.et, 10, 20)
    procs = [
        spawn_worker(dsn, c.name, c.et, V1, extra=["--version", "1"]),
        spawn_worker(dsn, c.name, c.et, V2, extra=["--version", "2"]),
    ]
    try:
        await wait_until(lambda: has(conn, f'"{c.schema(1)}".{c.table}', written), 60, "version 1 caught up")
        assert (await cli(dsn, "switch", c.name, "1"))[0] == 0
        await wait_until(lambda: has(conn, f'"{c.schema(2)}".{c.table}', written), 60, "version 2 caught up")
        procs[1].send_signal(signal.SIGKILL)  # version 2 stops mid-stream: it falls behind the new events
        procs[1].wait()
        written += await write(journal, c.et, 10, 5)
        await wait_until(lambda: has(conn, f"public.{c.table}", written), 60, "version 1 serving the new events")
        switch = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "projections", "switch", c.name, "2", "--wait", "120", "--dsn", dsn,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **FAST_ENV},
        )  # fmt: skip
        await wait_until(lambda: _switch_waiting(conn), 30, "the switch to hold version 1 and wait")
        switch.send_signal(signal.SIGKILL)
        assert await switch.wait() == -signal.SIGKILL
        await wait_until(lambda: _no_switch(conn), 30, "the server to roll the switch back")
        # nothing of it stayed: version 1 serves, the view reads it, and its worker commits again
        assert await states(conn, c) == {1: "serving", 2: "building"}
        assert await view_source(conn, c) == [c.table]
        written += await write(journal, c.et, 10, 5)
        await wait_until(lambda: has(conn, f"public.{c.table}", written), 60, "version 1 unblocked")
        # the switch run again waits for version 2, which is restarted meanwhile (its start is not
        # held up by the switch's locks), catches up, and the switch is done
        again = asyncio.create_task(cli(dsn, "switch", c.name, "2", "--wait", "60"))
        await wait_until(lambda: _switch_waiting(conn), 30, "the second switch to wait")
        procs.append(spawn_worker(dsn, c.name, c.et, V2, extra=["--version", "2"]))
        rc, _, err = await again
        assert rc == 0, err
        assert await states(conn, c) == {1: "retired", 2: "serving"}
        assert await view_source(conn, c) == [f"2:{c.table}"]
        assert await events_in(conn, f"public.{c.table}") == written
        assert (await cli(dsn, "switch", c.name, "2"))[1] == f"version 2 of {c.name} already serves\n"
    finally:
        stop(procs)
        await _drop(conn, c)


async def _no_switch(conn: asyncpg.Connection) -> bool:
    return not await _switch_waiting(conn)


async def test_bad_input_is_one_line_exit_2_and_changes_nothing(
    journal: Journal, conn: asyncpg.Connection, dsn: str, settings: JournalSettings
) -> None:
    c = Case()
    await write(journal, c.et, 2, 3)
    await register_on(journal, c.name, 1, c.et)
    await register_on(journal, c.name, 2, c.et)
    rc, _, err = await cli(dsn, "switch", c.name, "1")
    assert (rc, err) == (2, f"error: version 1 of '{c.name}' has no tables in schema '{c.schema(1)}' yet "
                            "(its handler creates them; nothing changed)\n")  # fmt: skip
    for v in (1, 2):
        await conn.execute(f'CREATE TABLE "{c.schema(v)}".{c.table} (pid text PRIMARY KEY, events int NOT NULL)')
    await conn.execute(f"INSERT INTO \"{c.schema(1)}\".{c.table} VALUES ('{c.et}|0', 3)")
    assert (await cli(dsn, "switch", c.name, "1"))[0] == 0
    # version 1 has processed an event version 2 has not
    row = OffsetRow(0, f"{c.et}|0", 3, await conn.fetchval("SELECT now()"))
    await ProjectionSql("public").save_offsets(conn, f"{c.name}@1", "0-1023", [row])
    heartbeat = OffsetRow(0, HEARTBEAT_PID, 0, await conn.fetchval("SELECT now() - interval '1 day'"))
    await ProjectionSql("public").save_offsets(conn, f"{c.name}@2", "0-1023", [heartbeat])
    before = (await states(conn, c), await view_source(conn, c))
    cases = {
        ("switch", c.name, "2", "--wait", "0"): f"error: version 2 of '{c.name}' has not caught up with version 1: "
        "1 persistence ids behind after 0 s (nothing changed; see projections status)",
        ("switch", c.name, "7"): f"error: projection '{c.name}' has no version 7: its versions are 1 (serving), "
        "2 (building)",
        ("switch", c.name + "x", "2"): f"error: projection '{c.name}x' has no versions: run one with projections "
        f"run {c.name}x --version 2",
        ("drop-version", c.name, "1"): f"error: version 1 of '{c.name}' serves the readers: switch to another first",
        ("run", "a@b", "--entity-type", c.et, "--handler", V1, "--version", "2"): "error: the name of a versioned "
        "projection must not contain '@': 'a@b'",
        ("run", c.name, "--entity-type", c.et, "--handler", V1, "--mode", "at-least-once", "--version", "2"): (
            "error: a versioned projection writes its tables in the handler's transaction: --mode exactly-once or "
            "grouped, not at-least-once"
        ),
        ("run", c.name, "--entity-type", c.et, "--handler", V1, "--states", "--version", "2"): "error: --version "
        "runs a handler over an entity type's events (not --tag, --to-kafka, --states)",
    }
    for args, said in cases.items():
        rc, _, err = await cli(dsn, *args)
        assert (rc, err) == (2, said + "\n"), (args, err)
    assert (await states(conn, c), await view_source(conn, c)) == before
    rc, _, err = await cli(dsn, "run", c.name, "--entity-type", "Other", "--handler", V1, "--version", "1")
    assert (rc, err.splitlines()[-1]) == (2, f"error: version 1 of '{c.name}' projects entity type '{c.et}', "
                                             "not 'Other'"), err  # fmt: skip
    assert [v.versioned_name for v in await list_versions(settings, c.name)] == [f"{c.name}@1", f"{c.name}@2"]
    await _drop(conn, c)


async def _drop(conn: asyncpg.Connection, c: Case) -> None:
    """Leave the shared database as found: the view and the versions' schemas."""
    await conn.execute(f"DROP VIEW IF EXISTS public.{c.table}")
    for v in (1, 2):
        await conn.execute(f'DROP SCHEMA IF EXISTS "{c.schema(v)}" CASCADE')


async def test_a_reader_blocked_by_the_switch_reads_the_new_view(conn: asyncpg.Connection, dsn: str) -> None:
    """The switch's statements (DROP VIEW, CREATE VIEW in one transaction): a reader whose query
    waits on the view's lock meanwhile gets the new view's rows after the commit, not an error
    (PostgreSQL looks the name up again when invalidations arrived while it waited)."""
    c, sql = Case(), VersionSql("public")
    for v, rows in ((1, 1), (2, 2)):
        await conn.execute(f'CREATE SCHEMA "{c.schema(v)}"')
        await conn.execute(
            f'CREATE TABLE "{c.schema(v)}".{c.table} AS SELECT g AS events FROM generate_series(1, {rows}) g'
        )
    await sql.create_view(conn, c.table, c.schema(1))
    switcher, reader = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        tx = switcher.transaction()
        await tx.start()
        await sql.drop_view(switcher, c.table)
        await sql.create_view(switcher, c.table, c.schema(2))
        read = asyncio.create_task(reader.fetchval(f"SELECT count(*) FROM public.{c.table}"))
        await wait_until(lambda: _waits_on_a_lock(conn, reader.get_server_pid()), 30, "the reader to wait on the view")
        assert not read.done()
        await tx.commit()
        assert await read == 2
    finally:
        await switcher.close()
        await reader.close()
        await _drop(conn, c)


async def _waits_on_a_lock(conn: asyncpg.Connection, pid: int) -> bool:
    return bool(await conn.fetchval("SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted", pid))
