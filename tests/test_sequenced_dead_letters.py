"""Sequenced dead letters (issue 36 item 4, ``retry-and-dead-letter-sequenced``): once an event
of a persistence id is dead-lettered, its later events are parked behind it while the other ids
go on, and retrying or discarding the dead letter drains them in seq_nr order, each once, with
the same handler and mode; then the id flows again. Every test ends by reading the read model's
order of application: per id, seq_nrs 1, 2, 3... with no gap and nothing twice."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from journal import EventEnvelope, Journal, JournalSettings, open_journal
from journal.errors import ConfigurationError
from projections import StateWorker, Worker
from projections.dead_letter_store import DeadLetterSql
from projections.dead_letters import discard, retry
from projections.parked_store import ParkedSql
from tests.projection_helpers import FAST_ENV, spawn_worker, stop
from tests.sequenced_handler import CREATE, project, project_fixed, project_one, project_one_fixed
from tests.support.waiting import wait_until
from tests.test_forget_everywhere import enc, tables_holding

DEAD = DeadLetterSql("public")
PARKED = ParkedSql("public")
SEQUENCED = "retry-and-dead-letter-sequenced"


@pytest.fixture
def fast(dsn: str) -> JournalSettings:
    return JournalSettings.load(
        env={}, dsn=dsn, lease_ttl=1.5, lease_renew_interval=0.3, handler_backoff=0.01,
        heartbeat_offset_interval=0.5, handler_attempts=2,
    )  # fmt: skip


@pytest.fixture
async def conn(journal: Journal, dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    await c.execute(CREATE)
    yield c
    await c.close()


async def applied(conn: asyncpg.Connection, pid: str) -> list[int]:
    """``pid``'s seq_nrs in the order the read model applied them."""
    return [r[0] for r in await conn.fetch("SELECT seq FROM seq_applied WHERE pid = $1 ORDER BY n", pid)]


async def assert_in_order(conn: asyncpg.Connection, written: dict[str, int]) -> None:
    """Every id's events applied once each, in seq_nr order, none missing."""
    for pid, last in written.items():
        assert await applied(conn, pid) == list(range(1, last + 1)), pid


def by_mode(mode: str, pool: asyncpg.Pool) -> tuple[Callable[..., Awaitable[None]], Callable[..., Awaitable[None]]]:
    """The poisoned handler and the fixed one, in the shape ``mode`` calls them."""
    if mode == "grouped":
        return project, project_fixed
    if mode == "exactly-once":
        return project_one, project_one_fixed

    async def alone(env: EventEnvelope) -> None:  # at-least-once: the handler's own connection
        async with pool.acquire() as c:
            await project(c, [env])

    async def alone_fixed(env: EventEnvelope) -> None:
        async with pool.acquire() as c:
            await project_fixed(c, [env])

    return alone, alone_fixed


@pytest.mark.parametrize("mode", ["grouped", "exactly-once", "at-least-once"])
async def test_later_events_wait_behind_the_dead_letter_and_drain_in_order(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings, dsn: str, mode: str
) -> None:
    """Five ids of six events, the third id's #2 poisoned: the other ids are applied, #3..#6 of
    the third are parked (and #7, written while it is held); a retry that fails again keeps
    the dead letter and the parked events; the fixed retry applies #2 and drains the parked in
    order while new events of the id keep coming (parked, or handled once it is free)."""
    run = uuid.uuid4().hex[:6]
    et, name = f"Seq{run}", f"seq-{mode}-{run}"
    pids = [f"{et}|{i}" for i in range(5)]
    held = pids[2]
    for n in range(1, 7):
        await asyncio.gather(*(journal.persist(p, [{"n": n, "poison": p == held and n == 2}]) for p in pids))
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    handler, fixed = by_mode(mode, pool)
    worker = Worker(journal, fast, name, et, handler, mode, recovery=SEQUENCED)
    task = asyncio.create_task(worker.run())
    try:

        async def settled(parked: int) -> bool:
            if task.done():
                task.result()  # a worker that stopped on an error fails the test at once
            done = [len(await applied(conn, p)) for p in pids]
            return done == [6, 6, 1, 6, 6] and await PARKED.count(conn, name) == parked

        await wait_until(lambda: settled(4), 30, "the other ids applied, #3..#6 parked")
        [letter] = await DEAD.letters(conn, name)
        assert (letter.persistence_id, letter.seq_nr) == (held, 2)
        assert await PARKED.behind(conn, name) == {(held, 2): 4}
        await journal.persist(held, [{"n": 7}])  # held: parked behind the dead letter too
        await wait_until(lambda: settled(5), 30, "#7 parked")

        again = await retry(journal, conn, DEAD, name, handler, mode)  # the bug is not fixed yet
        assert [(d.seq_nr, e.startswith("Poisoned")) for d, e in again.failed] == [(2, True)]
        assert again.drained == [] and await PARKED.count(conn, name) == 5 and await applied(conn, held) == [1]

        async def more() -> None:  # new events of the held id while it drains
            for n in range(8, 21):
                await journal.persist(held, [{"n": n}], expected_seq_nr=n - 1)

        writing = asyncio.create_task(more())
        done = await retry(journal, conn, DEAD, name, fixed, mode)
        await writing
        assert [(d.persistence_id, d.seq_nr) for d in done.applied] == [(held, 2)] and done.failed == []
        seqs = [n for _, n in done.drained]
        assert seqs[:5] == [3, 4, 5, 6, 7] and seqs == sorted(seqs)
        assert await PARKED.count(conn, name) == 0 and await DEAD.letters(conn, name) == []  # free again
        await wait_until(lambda: _len_is(conn, held, 20), 30, "the id flowing again")
        assert await PARKED.count(conn, name) == 0
        assert worker.stats.dead_lettered == 1 and worker.stats.parked >= 5
    finally:
        worker.stop()
        await task
        await pool.close()
    await assert_in_order(conn, {p: 20 if p == held else 6 for p in pids})


async def _len_is(conn: asyncpg.Connection, pid: str, n: int) -> bool:
    return len(await applied(conn, pid)) == n
