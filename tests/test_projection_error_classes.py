"""Which failures count toward ``handler_attempts``: the handler's own, not the database's."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest

from journal import EventEnvelope, Journal, JournalSettings
from journal.errors import HandlerFailed
from projections import Worker
from tests.support.waiting import wait_until


@pytest.fixture
def fast(dsn: str) -> JournalSettings:
    return JournalSettings.load(
        env={}, dsn=dsn, lease_ttl=1.5, lease_renew_interval=0.3, handler_backoff=0.02,
        handler_max_backoff=0.1, heartbeat_offset_interval=0.5, handler_attempts=3,
    )  # fmt: skip


@pytest.fixture
async def conn(journal: Journal, dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    await c.execute("CREATE TABLE IF NOT EXISTS t_classes (pid TEXT, seq BIGINT)")
    await c.execute("TRUNCATE t_classes")
    yield c
    await c.close()


async def test_a_lost_transaction_connection_is_not_a_handler_failure(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings
) -> None:
    """The handler's transaction connection is killed five times (more than handler_attempts):
    the worker retries without counting, and every event is applied exactly once."""
    for i in range(20):
        await journal.persist(f"Cls|{i}", [{"n": i}])
    kills = {"left": 5}
    killer = await asyncpg.connect(journal.settings.connection.dsn)  # not the test's polling connection

    async def handler(c: Any, envs: Sequence[EventEnvelope]) -> None:
        await c.executemany("INSERT INTO t_classes VALUES ($1, $2)", [(e.persistence_id, e.seq_nr) for e in envs])
        if kills["left"] > 0:
            kills["left"] -= 1
            await killer.execute("SELECT pg_terminate_backend($1)", c.get_server_pid())
            await c.execute("SELECT 1")  # fails: the connection is gone

    w = Worker(journal, fast, "p-classes-kill", "Cls", handler, "grouped")
    task = asyncio.create_task(w.run())
    try:

        async def done() -> bool:
            return int(await conn.fetchval("SELECT count(*) FROM t_classes")) >= 20

        await wait_until(done, 30, "every event applied")

        def settled() -> bool:  # every event committed, and the outage over (after its quiet time)
            return (w.stats.events >= 20 and w.outage.last is not None) or task.done()

        await wait_until(settled, 30, "the worker to commit every event and see the outage end")
        assert not task.done(), task
    finally:
        w.stop()
        await task
        await killer.close()
    assert kills["left"] == 0
    rows = await conn.fetch("SELECT pid, seq FROM t_classes")
    assert len(rows) == len({(r["pid"], r["seq"]) for r in rows}) == 20
    assert w.stats.retries == 0  # none counted toward handler_attempts
    assert w.outage.last is not None  # but noted as an outage (logged once, shown by status)


async def test_a_handlers_own_connection_error_still_counts(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings
) -> None:
    """An error of the handler's own making that merely looks like a network error (its own
    call refused) while our connection is fine: a handler failure, and the projection stops."""
    await journal.persist("Own|1", [{"n": 1}])

    async def handler(c: Any, envs: Sequence[EventEnvelope]) -> None:
        raise ConnectionRefusedError("the read model's HTTP API refused the call")

    w = Worker(journal, fast, "p-classes-own", "Own", handler, "grouped")
    with pytest.raises(HandlerFailed, match="refused the call"):
        await asyncio.wait_for(w.run(), 20)
    assert w.stats.retries == 3


async def test_a_commit_whose_answer_is_lost_is_not_applied_twice(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """The network drops while the server is committing: the server commits, the worker gets a
    connection error. It must find the batch committed and not run it again."""
    await conn.execute("DROP TABLE IF EXISTS t_commit")
    await conn.execute("CREATE TABLE t_commit (pid TEXT, seq BIGINT)")
    await conn.execute(
        """CREATE OR REPLACE FUNCTION t_commit_slow() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('sj.slow_commit', true) = 'on' THEN
    PERFORM set_config('sj.slow_commit', 'off', true);
    PERFORM pg_sleep(1.0);  -- at COMMIT: the client's connection is cut meanwhile
  END IF;
  RETURN NULL;
END $$"""
    )
    await conn.execute(
        "CREATE CONSTRAINT TRIGGER t_commit_slow AFTER INSERT ON t_commit "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION t_commit_slow()"
    )
    for i in range(10):
        await journal.persist(f"Cmt|{i}", [{"n": i}])
    cuts = {"left": 1}

    async def handler(c: Any, envs: Sequence[EventEnvelope]) -> None:
        await c.executemany("INSERT INTO t_commit VALUES ($1, $2)", [(e.persistence_id, e.seq_nr) for e in envs])
        if cuts["left"] > 0:
            cuts["left"] -= 1
            await c.execute("SELECT set_config('sj.slow_commit', 'on', true)")
            # the network cut, half a second into the server's COMMIT
            asyncio.get_running_loop().call_later(0.5, c._transport.abort)

    caplog.set_level(logging.INFO, logger="projections.runner")
    w = Worker(journal, fast, "p-classes-commit", "Cmt", handler, "grouped")
    task = asyncio.create_task(w.run())
    try:

        async def done() -> bool:
            return int(await conn.fetchval("SELECT count(DISTINCT (pid, seq)) FROM t_commit")) >= 10

        await wait_until(done, 30, "every event applied")

        def resolved() -> bool:  # the runner found out that the cut COMMIT had committed
            return any("committed before the connection was lost" in r.getMessage() for r in caplog.records)

        await wait_until(resolved, 30, "the runner to resolve the commit whose outcome was unknown")
    finally:
        w.stop()
        await task
    assert cuts["left"] == 0
    assert await conn.fetchval("SELECT count(*) - count(DISTINCT (pid, seq)) FROM t_commit") == 0
    assert any("committed before the connection was lost" in r.getMessage() for r in caplog.records)
