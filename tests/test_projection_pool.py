"""Projection workers on the journal's pool (one pool per process) whose handler reads the journal
inside its transaction, as the entities' writers do (``WriterHandler`` -> ``Processor.read`` ->
``highest_seq_nr``: a second connection of the same pool).

With as many slice ranges as the pool, every transaction holding a connection and waiting for
a second one would wait forever; the pool's transaction slots (journal/transaction_slots.py)
admit fewer than half the pool, so the run finishes, also through a database crash under load.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest

from journal import EventEnvelope, Journal, JournalSettings, JournalUnavailable, SequenceConflict, open_journal
from journal.entities import Processor, WriterHandler
from journal.errors import ConfigurationError
from journal.ids import NUMBER_OF_SLICES, entity_id_of, persistence_id_of, slice_for
from journal.postgres.dsn import asyncpg_dsn
from journal.postgres.migrations import upgrade
from projections import Worker
from projections.postgres_store import ProjectionSql
from tests.conftest import truncate_all
from tests.support.private_server import crash
from tests.support.waiting import wait_until

ET, OUT, NAME = "PoolSrc", "PoolOut", "p-pool"
POOL = 4
RANGES = 8
"""One worker's share split into this many ranges by the paused slices between them."""
WIDTH = NUMBER_OF_SLICES // (2 * RANGES)
PER_RANGE = 4
"""Source pids per range."""
PER_PID = 6
"""Events of each source pid."""


def fast(dsn: str, **more: Any) -> JournalSettings:
    return JournalSettings.load(
        env={}, dsn=dsn, pool_max_size=POOL, lease_ttl=1.5, lease_renew_interval=0.3, handler_backoff=0.02,
        group_size=10, **more,
    )  # fmt: skip


def source_pids() -> list[str]:
    """``PER_RANGE`` pids in each range the worker processes (none in the paused slices)."""
    chosen: dict[int, list[str]] = {k: [] for k in range(RANGES)}
    for i in itertools.count():
        pid = f"{ET}|e{i}"
        chunk = slice_for(pid) // WIDTH
        if chunk % 2 == 0 and len(chosen[chunk // 2]) < PER_RANGE:
            chosen[chunk // 2].append(pid)
        if all(len(v) == PER_RANGE for v in chosen.values()):
            return [p for v in chosen.values() for p in v]
    raise AssertionError("unreachable")


async def pause_between_ranges(dsn: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        for k in range(RANGES):
            lo = (2 * k + 1) * WIDTH
            await ProjectionSql("public").set_paused(conn, NAME, f"{lo}-{lo + WIDTH - 1}", True)
    finally:
        await conn.close()


def copy(env: EventEnvelope) -> list[object]:
    return [{"seq": env.seq_nr}]


class Counted:
    """The library's WriterHandler, counting the transactions inside it at once."""

    def __init__(self, inner: WriterHandler) -> None:
        self.inner = inner
        self.inside = 0
        self.most = 0

    async def __call__(self, conn: Any, envs: Sequence[EventEnvelope]) -> None:
        self.inside += 1
        self.most = max(self.most, self.inside)
        try:
            await self.inner(conn, envs)
        finally:
            self.inside -= 1


async def write(j: Journal, pids: list[str], upto: int) -> None:
    """Each pid's events up to ``upto``, one per call, all pids at once; a call that fails in an
    outage is written again after reading where the pid is (its outcome was unknown)."""

    async def one(pid: str) -> None:
        while (n := await _highest(j, pid)) < upto:
            try:
                await j.persist(pid, [{"n": n + 1}], expected_seq_nr=n)
            except (JournalUnavailable, SequenceConflict):
                await asyncio.sleep(0.05)  # the load's pace while the database is down (not a wait)

    await asyncio.gather(*(one(p) for p in pids))


async def _highest(j: Journal, pid: str) -> int:
    while True:
        try:
            return await j.highest_seq_nr(pid)
        except JournalUnavailable:
            await asyncio.sleep(0.05)  # as above


async def applied(j: Journal, pids: list[str], upto: int) -> list[str]:
    """Source pids whose output is not yet exactly one event per source event, in order."""
    wrong = []
    for pid in pids:
        out = [e.event["seq"] async for e in j.current_events_by_persistence_id(target(pid))]
        if out != list(range(1, upto + 1)):
            wrong.append(pid)
    return wrong


def target(pid: str) -> str:
    return persistence_id_of(OUT, entity_id_of(pid))


async def _nothing_left(j: Journal, pids: list[str], upto: int) -> bool:
    return not await _retried(lambda: applied(j, pids, upto))


async def _retried(op: Any) -> Any:
    try:
        return await op()
    except JournalUnavailable:
        return ["the database is down"]


async def _run(dsn: str, *, crash_server: Any = None) -> tuple[Counted, Worker]:
    await pause_between_ranges(dsn)
    pids = source_pids()
    settings = fast(dsn, connect_timeout=1.0, initial_backoff=0.02, handler_max_backoff=0.5)
    async with open_journal(dsn, settings=settings) as j:
        handler = Counted(WriterHandler(Processor(j, NAME, OUT, copy, batch_size=5)))
        w = Worker(j, settings, NAME, ET, handler, "grouped")
        task = asyncio.create_task(w.run())
        try:
            # the bound of the whole run: a hang waits inside a read of the journal, where the
            # deadlines of wait_until are never looked at
            async with asyncio.timeout(30):
                await wait_until(lambda: len(w.owned) == RANGES or task.done(), 20, f"{RANGES} ranges")
                writing = asyncio.create_task(write(j, pids, PER_PID))
                if crash_server is not None:
                    await wait_until(lambda: w.stats.events > 0 or task.done(), 20, "the first batches")
                    await asyncio.to_thread(crash, crash_server)
                    await asyncio.to_thread(crash_server.ensure_postgres_running)
                await writing
                await wait_until(lambda: task.done() or _nothing_left(j, pids, PER_PID), 30, "every event applied")
            assert not task.done(), f"the worker stopped: {task}"
        except TimeoutError:
            raise AssertionError(
                f"hung with {handler.inside} transactions inside the handler, {w.stats.events} events applied"
            ) from None
        finally:
            w.stop()
            done, _ = await asyncio.wait({task}, timeout=10)
            if not done:  # hung: its lease round waits for a connection (the test has failed already)
                task.cancel()
                await asyncio.wait({task}, timeout=10)
        assert await applied(j, pids, PER_PID) == []
    return handler, w


async def test_more_ranges_than_the_pool_never_wait_forever_for_a_connection(dsn: str) -> None:
    """One worker, 8 ranges, a pool of 4, the entities' writer handler under write load: every
    event applied once, 1 transaction at a time (hung before the bound: every connection
    held by a transaction waiting for its handler's second one)."""
    await truncate_all(dsn)
    handler, worker = await _run(dsn)
    assert 1 <= handler.most <= (POOL - 1) // 2
    assert worker.stats.retries == 0, "a batch failed on the way"


async def test_a_database_crash_under_load_on_the_shared_pool_leaves_every_event_applied_once(
    private_server: Any,
) -> None:
    """The same run, the database crashed (``immediate``) and started again mid-load: the
    transactions cut off give back their slots, and every event is applied exactly once."""
    dsn = private_server.get_uri()
    await asyncio.to_thread(upgrade, dsn)
    handler, worker = await _run(dsn, crash_server=private_server)
    assert worker.outage.detail, "the worker never met the crash"
    assert handler.most <= (POOL - 1) // 2


async def test_a_journal_pool_of_two_connections_is_refused_for_a_worker_by_name(dsn: str) -> None:
    """A pool of 2 has no room for a transaction, its lease round and a handler's read inside it:
    a typed error naming the setting, before the worker takes a lease."""
    settings = JournalSettings.load(env={}, dsn=dsn, pool_max_size=2)
    async with open_journal(dsn, settings=settings) as j:
        w = Worker(j, settings, "p-pool-one", ET, Counted(WriterHandler(Processor(j, NAME, OUT, copy))), "grouped")
        with pytest.raises(ConfigurationError, match="pool_max_size"):
            await w.run()
