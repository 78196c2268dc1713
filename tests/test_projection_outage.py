"""A real ``projections run`` worker process rides through a 60-second outage of its database.

A private embedded PostgreSQL (never the shared test server) is stopped ("immediate": a crash,
connections cut mid-transaction) under write load and started again a minute later. The worker
must not exit; afterwards every event is projected exactly once (the read model equals a replay
of the journal), the outage is logged once rather than per attempt, and the worker's row in
``projections status`` says the database was unavailable.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from projection_helpers import FAST_ENV

from journal import JournalSettings, JournalUnavailable, SequenceConflict, open_journal
from journal.postgres.dsn import asyncpg_dsn
from journal.postgres.migrations import upgrade
from projections.demo.cart import cart_event, prepare, verify
from projections.postgres_store import ProjectionSql
from tests.support.private_server import crash
from tests.support.waiting import wait_until

OUTAGE_SECONDS = 60.0
ET, NAME = "OutCart", "p-outage"


class Writers:
    """Cart events at a steady rate; failures during the outage are fine (the journal is the truth)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.acknowledged = 0
        self.failed = 0
        self._stop = asyncio.Event()

    async def run(self, writers: int = 4) -> None:
        settings = JournalSettings.load(env={}, dsn=self.dsn, attempts=2, initial_backoff=0.05, connect_timeout=1.0)
        async with open_journal(self.dsn, settings=settings) as j:
            await asyncio.gather(*(self._one(j, k) for k in range(writers)))

    async def _one(self, j: Any, k: int) -> None:
        rng = random.Random(k)
        counts: dict[str, int] = {}
        while not self._stop.is_set():
            pid = f"{ET}|cart-{k}-{rng.randrange(40)}"
            n = counts.get(pid, 0)
            drawn = [cart_event(rng, n + i) for i in range(rng.randint(1, 3))]
            events = [e for e in drawn if e["type"] != "CheckedOut"]  # carts stay open: always writable
            try:
                if events:
                    await j.persist(pid, events)
                    counts[pid] = n + len(events)
                    self.acknowledged += len(events)
            except (JournalUnavailable, SequenceConflict):
                self.failed += 1
                await asyncio.sleep(0.2)  # the load's back-off and pace (the scenario, not a wait)
            await asyncio.sleep(0.01)

    def stop(self) -> None:
        self._stop.set()


def spawn(dsn: str, log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "projections", "run", NAME, "--entity-type", ET,
             "--handler", "projections.demo.cart:project_carts", "--mode", "grouped", "--dsn", dsn, "--no-progress"],
            env={**os.environ, **FAST_ENV},
            stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip


@pytest.mark.slow
async def test_a_worker_rides_through_a_60_second_outage_under_load(private_server: Any, tmp_path: Path) -> None:
    dsn = private_server.get_uri()
    await asyncio.to_thread(upgrade, dsn)
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    await prepare(conn)
    await conn.close()
    log_path = tmp_path / "worker.log"
    worker = spawn(dsn, log_path)
    load = Writers(dsn)
    writing = asyncio.create_task(load.run())
    try:
        conn = await asyncpg.connect(asyncpg_dsn(dsn))
        try:

            async def projected() -> int:
                return int(await conn.fetchval("SELECT count(*) FROM demo_cart_projected"))

            await wait_until(lambda: _more_than(projected, 300), 60, "the projection under way")
        finally:
            await conn.close()

        await asyncio.to_thread(crash, private_server)
        t0 = time.monotonic()
        while time.monotonic() - t0 < OUTAGE_SECONDS:
            assert worker.poll() is None, f"the worker exited during the outage: {_tail(log_path)}"
            await asyncio.sleep(1.0)  # the thing under test: the outage lasts OUTAGE_SECONDS
        await asyncio.to_thread(private_server.ensure_postgres_running)
        await wait_until(lambda: _acknowledged_after(load, 300), 60, "writes after the outage")
    finally:
        load.stop()
        await writing
    try:
        async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
            conn = await asyncpg.connect(asyncpg_dsn(dsn))
            try:
                stored = sum([1 async for _ in j.current_events_by_slices(ET, 0, 1023)])

                async def caught_up() -> bool:
                    n = await conn.fetchval("SELECT count(DISTINCT (persistence_id, seq_nr)) FROM demo_cart_projected")
                    return int(n) >= stored

                await wait_until(caught_up, 90, f"all {stored} stored events projected")
                await asyncio.sleep(1.0)  # anything applied twice would show by now
                v = await verify(j, conn, ET)
                assert (v.written, v.missing, v.duplicates, v.view_mismatches) == (stored, 0, 0, 0), v
                assert worker.poll() is None, _tail(log_path)

                async def noted() -> list[str]:  # once the outage has cleared (a few quiet seconds)
                    rows = await ProjectionSql("public").leases.workers(conn, NAME)
                    notes = [r["error"] or "" for r in rows if r["state"] == "running"]
                    return [n for n in notes if n.startswith("database was unavailable from")]

                await wait_until(noted, 30, "the outage noted in the worker's row")
            finally:
                await conn.close()
        status = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "projections", "status", NAME, "--dsn", dsn],
            capture_output=True, text=True, env={**os.environ, "COLUMNS": "400"}, timeout=60,
        )  # fmt: skip
        assert status.returncode == 0 and "database was unavailable from" in status.stdout, status.stdout
    finally:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    log = log_path.read_text()
    assert "batch failed" not in log and "HandlerFailed" not in log, _tail(log_path)
    # logged once per outage (and when it ends), not once per attempt
    assert 1 <= log.count("database unavailable (") <= 3, _tail(log_path)
    assert "database available again: cleared after" in log, _tail(log_path)
    assert log.count(" WARNING ") <= 12, _tail(log_path)  # the journal's own retries are quiet too


async def _more_than(count: Any, n: int) -> bool:
    return bool(await count() > n)


async def _acknowledged_after(load: Writers, n: int) -> bool:
    if not hasattr(load, "_mark"):
        load._mark = load.acknowledged  # type: ignore[attr-defined]
    return bool(load.acknowledged - load._mark >= n)  # type: ignore[attr-defined]


def _tail(path: Path) -> str:
    return path.read_text()[-3000:]
