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
from prometheus_client import REGISTRY

from journal import EventEnvelope, Journal, JournalSettings, open_journal
from journal.errors import ConfigurationError
from projections import StateWorker, TagWorker, Worker
from projections.dead_letter_store import DeadLetterSql
from projections.dead_letters import discard, retry
from projections.parked_store import ParkedSql
from tests.projection_helpers import FAST_ENV, spawn_worker, stop
from tests.sequenced_handler import CREATE, Poisoned, project, project_fixed, project_one, project_one_fixed
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


def failing_on(
    mode: str, fixed: Callable[..., Awaitable[None]], pid: str, seq_nr: int
) -> Callable[..., Awaitable[None]]:
    """``fixed``, failing on ``pid`` #``seq_nr`` still (a second bug), in the shape of ``mode``."""

    def check(env: EventEnvelope) -> None:
        if (env.persistence_id, env.seq_nr) == (pid, seq_nr):
            raise Poisoned(f"{pid} #{seq_nr} in the drain")

    async def grouped(conn: Any, envs: Any) -> None:
        for e in envs:
            check(e)
        await fixed(conn, envs)

    async def one(conn: Any, env: EventEnvelope) -> None:
        check(env)
        await fixed(conn, env)

    async def alone(env: EventEnvelope) -> None:
        check(env)
        await fixed(env)

    return {"grouped": grouped, "exactly-once": one}.get(mode, alone)


@pytest.mark.parametrize("mode", ["grouped", "exactly-once", "at-least-once"])
async def test_later_events_wait_behind_the_dead_letter_and_drain_in_order(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings, dsn: str, mode: str
) -> None:
    """Five ids of six events, the third id's #2 poisoned: the other ids are applied, #3..#6 of
    the third are parked (and #7, written while it is held); a retry that fails again keeps
    the dead letter and the parked events; a retry whose handler still fails on #4 applies #2 and
    #3 and makes #4 the dead letter, #5..#7 parked behind it; the fixed retry applies #4 and
    drains the parked in order while new events of the id keep coming (parked, or handled once
    it is free)."""
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

        half = await retry(journal, conn, DEAD, name, failing_on(mode, fixed, held, 4), mode)
        assert [d.seq_nr for d in half.applied] == [2] and half.drained == [(held, 3)]
        assert [(d.seq_nr, e) for d, e in half.failed] == [(4, f"Poisoned: {held} #4 in the drain")]
        assert await PARKED.behind(conn, name) == {(held, 4): 3}  # #4 the dead letter now, #5..#7 behind it

        async def more() -> None:  # new events of the held id while it drains
            for n in range(8, 21):
                await journal.persist(held, [{"n": n}], expected_seq_nr=n - 1)

        writing = asyncio.create_task(more())
        done = await retry(journal, conn, DEAD, name, fixed, mode)
        await writing
        assert [(d.persistence_id, d.seq_nr) for d in done.applied] == [(held, 4)] and done.failed == []
        seqs = [n for _, n in done.drained]
        assert seqs[:3] == [5, 6, 7] and seqs == sorted(seqs)
        assert await PARKED.count(conn, name) == 0 and await DEAD.letters(conn, name) == []  # free again
        await wait_until(lambda: _len_is(conn, held, 20), 30, "the id flowing again")
        assert await PARKED.count(conn, name) == 0
        assert worker.stats.dead_lettered == 1 and worker.stats.parked >= 5
        assert _metric("projection_events_parked_total", name) == worker.stats.parked
    finally:
        worker.stop()
        await task
        await pool.close()
    await assert_in_order(conn, {p: 20 if p == held else 6 for p in pids})


def _metric(name: str, projection: str) -> float:
    return sum(
        s.value for m in REGISTRY.collect() for s in m.samples
        if s.name == name and s.labels.get("projection") == projection
    )  # fmt: skip


async def test_a_tag_projection_holds_an_id_behind_its_dead_letter(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings
) -> None:
    """Over a tag: the poisoned id's later events wait, the other id goes on; the retry drains."""
    run = uuid.uuid4().hex[:6]
    tag, name = f"seqtag{run}", f"seq-tag-{run}"
    a, b = f"SeqT{run}|a", f"SeqT{run}|b"
    for n in range(1, 5):
        for pid in (a, b):
            await journal.persist(pid, [{"n": n, "poison": pid == a and n == 2}], tags=[tag])
    worker = TagWorker(journal, fast, name, tag, project, "grouped", recovery=SEQUENCED)
    task = asyncio.create_task(worker.run())
    try:
        await wait_until(lambda: _parked_at_least(conn, name, a, 2), 30, "#3 and #4 of a parked")
        await wait_until(lambda: _len_is(conn, b, 4), 30, "b applied")
        assert await applied(conn, a) == [1]
        [letter] = await DEAD.letters(conn, name)
        assert letter.projection_key == f"tag:{tag}"
        done = await retry(journal, conn, DEAD, name, project_fixed, "grouped")
        assert done.drained == [(a, 3), (a, 4)]
    finally:
        worker.stop()
        await task
    await assert_in_order(conn, {a: 4, b: 4})


async def _len_is(conn: asyncpg.Connection, pid: str, n: int) -> bool:
    return len(await applied(conn, pid)) == n


def _cli(dsn: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "projections", *args, "--dsn", dsn], capture_output=True, text=True, timeout=120,
        env={**os.environ, **FAST_ENV, "COLUMNS": "200", **(env or {})},
    )  # fmt: skip


def _slow_retry(dsn: str, name: str, pid: str, fixed: list[str]) -> subprocess.Popen[bytes]:
    """``projections dead-letters retry`` whose fixed handler takes 50 ms an event (to be killed)."""
    return subprocess.Popen(
        [sys.executable, "-m", "projections", "dead-letters", "retry", name, "--pid", pid, *fixed, "--dsn", dsn],
        env={**os.environ, **FAST_ENV, "SJ_TEST_DRAIN_PAUSE": "0.05"}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def _kill9(p: subprocess.Popen[Any]) -> None:
    os.kill(p.pid, signal.SIGKILL)
    p.wait(15)


async def test_worker_processes_killed_while_parked_and_while_draining_keep_each_ids_order(
    journal: Journal, conn: asyncpg.Connection, dsn: str
) -> None:
    """Worker processes (grouped) under writes to eight ids; #10 of one and #15 of another are
    poisoned. The worker is killed with -9 while events are parked (its successor keeps parking
    them), then killed again together with a `dead-letters retry` process half-way through the
    drain; the next retry finishes the drain, `discard --handler` drains the other id. Every id
    ends with every written event applied once, in seq_nr order."""
    run = uuid.uuid4().hex[:6]
    et, name = f"SeqK{run}", f"seq-kill-{run}"
    held, other = f"{et}|w3", f"{et}|w5"
    spawn = lambda: spawn_worker(  # noqa: E731
        dsn, name, et, "tests.sequenced_handler:project", extra=["--on-failure", f"{SEQUENCED}:2"]
    )
    worker = spawn()
    written: dict[str, int] = {}
    stop_writing = asyncio.Event()

    async def writer(i: int) -> None:  # about 40 events a second per id, until told to stop
        pid, n = f"{et}|w{i}", 0
        while not stop_writing.is_set():
            n += 1
            poison = (pid, n) in ((held, 10), (other, 15))
            await journal.persist(pid, [{"n": n, "poison": poison}], expected_seq_nr=n - 1)
            written[pid] = n
            await asyncio.sleep(0.025)  # the pace of the load, not a wait for a condition

    writers = [asyncio.create_task(writer(i)) for i in range(8)]
    procs = [worker]
    try:
        await wait_until(lambda: _parked_at_least(conn, name, held, 10), 90, "events parked behind #10")
        _kill9(worker)
        before = await PARKED.count(conn, name, held)
        worker = spawn()
        procs.append(worker)
        await wait_until(lambda: _parked_at_least(conn, name, held, before + 10), 90, "the successor parking")
        assert await applied(conn, held) == list(range(1, 10))  # nothing of it applied past the dead letter
        status = await asyncio.to_thread(_cli, dsn, "status", name, "--json")
        assert json.loads(status.stdout)[0]["parked"] >= before + 10
        listed = await asyncio.to_thread(_cli, dsn, "dead-letters", "list", name)
        assert f"{held} #10" in listed.stdout and "parked behind" in listed.stdout, listed.stdout

        refused = await asyncio.to_thread(_cli, dsn, "dead-letters", "discard", name, "--pid", other)
        assert refused.returncode == 2 and "parked behind its dead letters" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and len(await DEAD.letters(conn, name)) == 2

        fixed = ["--handler", "tests.sequenced_handler:project_fixed"]
        retrying = _slow_retry(dsn, name, held, fixed)
        procs.append(retrying)
        await wait_until(lambda: _applied_at_least(conn, held, 15), 60, "the drain under way")
        _kill9(retrying)
        _kill9(worker)
        assert await PARKED.count(conn, name, held) > 0 and [
            d.persistence_id for d in await DEAD.letters(conn, name)
        ] == [other]
        listed = await asyncio.to_thread(_cli, dsn, "dead-letters", "list", name)
        assert "no dead letter ahead" in listed.stdout, listed.stdout
        worker = spawn()
        procs.append(worker)
        finished = await asyncio.to_thread(_cli, dsn, "dead-letters", "retry", name, "--pid", held, *fixed)
        assert finished.returncode == 0 and "drained" in finished.stdout, finished.stdout + finished.stderr
        discarded = await asyncio.to_thread(_cli, dsn, "dead-letters", "discard", name, "--pid", other, *fixed)
        assert discarded.returncode == 0 and "discarded 1 dead letters" in discarded.stdout, discarded.stderr
        stop_writing.set()
        await asyncio.gather(*writers)
        expected = {p: n - (1 if p == other else 0) for p, n in written.items()}
        await wait_until(lambda: _all_applied(conn, expected), 90, "every written event applied")
    finally:
        stop_writing.set()
        await asyncio.gather(*writers, return_exceptions=True)
        stop(procs)
    assert await PARKED.count(conn, name) == 0 and await DEAD.letters(conn, name) == []
    assert await applied(conn, other) == [*range(1, 15), *range(16, written[other] + 1)]  # #15 discarded
    await assert_in_order(conn, {p: n for p, n in written.items() if p != other})


async def _parked_at_least(conn: asyncpg.Connection, name: str, pid: str, n: int) -> bool:
    return await PARKED.count(conn, name, pid) >= n


async def _applied_at_least(conn: asyncpg.Connection, pid: str, n: int) -> bool:
    return len(await applied(conn, pid)) >= n


async def _all_applied(conn: asyncpg.Connection, expected: dict[str, int]) -> bool:
    rows = await conn.fetch("SELECT pid, count(*) FROM seq_applied WHERE pid = ANY($1) GROUP BY pid", list(expected))
    return {r[0]: r[1] for r in rows} == expected


async def test_an_encrypting_journal_parks_no_plaintext_and_a_forgotten_event_drains(
    journal: Journal, conn: asyncpg.Connection, dsn: str
) -> None:
    """A parked event names its event and holds none of its payload: no table holds the
    subject's secret while it is parked; after `forget`, the drain (by `discard` with the
    handler) hands the handler the forgotten event, in order."""
    secret = f"parked-secret-{uuid.uuid4().hex[:8]}@example.com"
    et = f"SeqE{uuid.uuid4().hex[:6]}"
    pid, name = f"{et}|ann", f"seq-enc-{et}"
    settings = enc(dsn)
    async with open_journal(dsn, settings=settings) as j:
        await j.persist(pid, [{"email": secret}, {"email": secret, "poison": True}, {"email": secret}])
        await j.persist(pid, [{"email": secret}])
        w = Worker(j, settings, name, et, project_one, "exactly-once", recovery=SEQUENCED)
        task = asyncio.create_task(w.run())
        try:
            await wait_until(lambda: _parked_at_least(conn, name, pid, 2), 30, "two events parked")
        finally:
            w.stop()
            await task
        assert await tables_holding(conn, secret) == []
        assert await j.forget(pid) is True
        seen: list[Any] = []

        async def fixed(c: asyncpg.Connection, env: EventEnvelope) -> None:
            seen.append(type(env.event).__name__)
            await project_one_fixed(c, env)

        n, result = await discard(conn, DEAD, name, pid, None, j, fixed, "exactly-once")
        assert n == 1 and result.drained == [(pid, 3), (pid, 4)] and seen == ["Forgotten", "Forgotten"]
    assert await applied(conn, pid) == [1, 3, 4]  # #2 discarded
    assert await PARKED.count(conn, name) == 0 and await tables_holding(conn, secret) == []


def test_a_state_projection_refuses_the_sequenced_strategy(journal: Journal, fast: JournalSettings, dsn: str) -> None:
    with pytest.raises(ConfigurationError, match="retry-and-dead-letter-sequenced is for events"):
        StateWorker(journal, fast, "seq-state", "Thing", project, "grouped", recovery=SEQUENCED)
    run = ["run", "seq-state", "--entity-type", "Thing", "--handler", "tests.sequenced_handler:project", "--states"]
    refused = _cli(dsn, *run, "--on-failure", SEQUENCED)
    assert refused.returncode == 2 and refused.stderr.startswith("error: retry-and-dead-letter-sequenced is for events")
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
