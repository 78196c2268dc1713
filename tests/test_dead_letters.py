"""Handler failure strategies and dead letters (issue 26): a poisoned event is isolated from its
batch, parked in the transaction that moves the offset past it, and applied once on retry."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from journal import EventEnvelope, Journal, JournalSettings, Write
from journal.errors import ConfigurationError, HandlerFailed
from journal.ids import slice_for
from projections import TagWorker, Worker
from projections.dead_letter_store import DeadLetterSql
from projections.dead_letters import retry
from projections.postgres_store import ProjectionSql
from projections.recovery import HandlerRecovery
from projections.tag_offset_store import TagOffsetSql
from tests.poison_handler import CREATE, project, project_fixed
from tests.projection_helpers import FAST_ENV, spawn_worker, stop
from tests.support.waiting import wait_until

SQL = ProjectionSql("public")
DEAD = DeadLetterSql("public")


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
    await c.execute("TRUNCATE poison_projected")
    yield c
    await c.close()


async def projected(conn: asyncpg.Connection) -> set[tuple[str, int]]:
    return {(r[0], r[1]) for r in await conn.fetch("SELECT pid, seq FROM poison_projected")}


async def write_with_poison(journal: Journal, et: str, pids: int, per: int, poison: set[tuple[int, int]]) -> set:
    """``pids`` x ``per`` events; (pid index, round) in ``poison`` are poisoned. Returns all (pid, seq)."""
    for r in range(per):
        await asyncio.gather(
            *(journal.persist(f"{et}|p{i}", [{"n": r, "poison": (i, r) in poison}]) for i in range(pids))
        )
    return {(f"{et}|p{i}", r + 1) for i in range(pids) for r in range(per)}


async def run_until(worker: Worker, cond: Any, timeout: float = 30) -> None:  # noqa: ASYNC109
    task = asyncio.create_task(worker.run())

    async def done() -> bool:
        if task.done():
            task.result()  # a worker that stopped on an error fails the test at once
        return bool(await cond())

    try:
        await wait_until(done, timeout, "the projection")
    finally:
        worker.stop()
        await task


@pytest.mark.parametrize("mode", ["grouped", "exactly-once"])
async def test_a_poisoned_event_is_isolated_and_dead_lettered_with_its_offset(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings, mode: str
) -> None:
    everything = await write_with_poison(journal, "DL", 12, 4, {(3, 1), (7, 2)})
    poisoned = {("DL|p3", 2), ("DL|p7", 3)}

    async def one(c: Any, env: EventEnvelope) -> None:
        await project(c, [env])

    handler = project if mode == "grouped" else one
    w = Worker(journal, fast, f"dl-{mode}", "DL", handler, mode, recovery="retry-and-dead-letter")
    await run_until(w, lambda: _has(conn, everything - poisoned))
    assert await projected(conn) == everything - poisoned  # the rest applied, each once (primary key)
    letters = await DEAD.letters(conn, f"dl-{mode}")
    assert {(d.persistence_id, d.seq_nr) for d in letters} == poisoned
    assert all(d.attempts == 2 and "Poisoned: cannot handle" in d.error and "Traceback" in d.traceback
               for d in letters)  # fmt: skip
    assert all(d.first_failure <= d.last_failure for d in letters)
    for pid, _ in poisoned:  # the offset moved past the poisoned event (and the later ones)
        stored = await SQL.load_pid(conn, f"dl-{mode}", slice_for(pid), pid)
        assert stored is not None and stored[0] == 4
    assert w.stats.dead_lettered == 2
    assert _metric("projection_dead_letters_total", f"dl-{mode}") == 2.0

    # the handler is fixed: retry applies both, in order, once; a second retry finds nothing
    result = await retry(journal, conn, DEAD, f"dl-{mode}", project_fixed, "grouped")
    assert [(d.persistence_id, d.seq_nr) for d in result.applied] == [("DL|p3", 2), ("DL|p7", 3)]
    assert await projected(conn) == everything
    assert await DEAD.letters(conn, f"dl-{mode}") == []
    again = await retry(journal, conn, DEAD, f"dl-{mode}", project_fixed, "grouped")
    assert again.applied == [] and again.failed == []


async def test_a_dead_letters_traceback_is_the_handlers_once(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings
) -> None:
    """A poisoned event found by bisecting a batch of 64: its dead letter holds the handler's
    traceback once, not chained to the bisection's HandlerFailed at every level (before: the
    chain five times over, 'During handling of the above exception' at each level, ~5 KB)."""
    await journal.persist_many([Write(f"TB|p{i}", [{"n": 0, "poison": i == 37}], 0) for i in range(64)])
    w = Worker(journal, fast, "tb", "TB", project, "grouped", recovery="retry-and-dead-letter")
    await run_until(w, lambda: _letters(conn, "tb"))
    [letter] = await DEAD.letters(conn, "tb")
    assert letter.persistence_id == "TB|p37" and "Poisoned: cannot handle TB|p37 #1" in letter.traceback
    assert letter.traceback.count("Traceback (most recent call last)") == 1
    assert "HandlerFailed" not in letter.traceback and "During handling" not in letter.traceback
    assert len(letter.traceback) < 2000, len(letter.traceback)


async def test_retry_that_fails_again_keeps_the_letter_and_holds_back_the_pids_later_ones(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings
) -> None:
    everything = await write_with_poison(journal, "DW", 2, 3, {(0, 0), (0, 2)})
    w = Worker(journal, fast, "dw", "DW", project, "grouped", recovery="retry-and-dead-letter:1")
    await run_until(w, lambda: _has(conn, everything - {("DW|p0", 1), ("DW|p0", 3)}))
    result = await retry(journal, conn, DEAD, "dw", project, "grouped")  # not fixed yet
    assert [(d.persistence_id, d.seq_nr) for d, _ in result.failed] == [("DW|p0", 1)]
    assert [(d.persistence_id, d.seq_nr) for d in result.waiting] == [("DW|p0", 3)]
    letters = {(d.persistence_id, d.seq_nr): d for d in await DEAD.letters(conn, "dw")}
    assert letters[("DW|p0", 1)].attempts == 2 and letters[("DW|p0", 3)].attempts == 1
    assert ("DW|p0", 1) not in await projected(conn)


async def test_retry_and_skip_moves_past_without_a_dead_letter(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings
) -> None:
    everything = await write_with_poison(journal, "SK", 8, 3, {(5, 1)})
    w = Worker(journal, fast, "sk", "SK", project, "grouped", recovery=HandlerRecovery("retry-and-skip", 3))
    await run_until(w, lambda: _has(conn, everything - {("SK|p5", 2)}))
    assert await projected(conn) == everything - {("SK|p5", 2)}
    assert await DEAD.letters(conn, "sk") == []
    assert w.stats.skipped == 1 and w.stats.retries >= 3
    assert (await SQL.load_pid(conn, "sk", slice_for("SK|p5"), "SK|p5") or (0,))[0] == 3


@pytest.mark.parametrize(("strategy", "tries"), [("fail", 1), ("retry-and-fail", 2)])
async def test_fail_strategies_stop_the_projection(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings, strategy: str, tries: int
) -> None:
    await write_with_poison(journal, "FS", 1, 1, {(0, 0)})
    calls = 0

    async def counting(c: Any, envs: Sequence[EventEnvelope]) -> None:
        nonlocal calls
        calls += 1
        await project(c, envs)

    w = Worker(journal, fast, f"fs-{strategy}", "FS", counting, "grouped", recovery=strategy)
    with pytest.raises(HandlerFailed, match="Poisoned"):
        await asyncio.wait_for(w.run(), 30)
    assert calls == tries
    assert await DEAD.letters(conn, f"fs-{strategy}") == []


def test_recovery_is_validated() -> None:
    s = JournalSettings.load(env={}).projection
    assert HandlerRecovery.parse(None, s) == HandlerRecovery("retry-and-fail")
    assert HandlerRecovery.parse("retry-and-skip:7", s).tries(s) == 7
    assert HandlerRecovery.parse("fail", s).tries(s) == 1
    for bad in ("retry", "retry-and-skip:x", "retry-and-skip:0", "fail:3"):
        with pytest.raises(ConfigurationError):
            HandlerRecovery.parse(bad, s)
    with pytest.raises(ConfigurationError, match="handler_recovery"):
        JournalSettings.load(env={"JOURNAL_PROJECTION_HANDLER_RECOVERY": "ignore"})
    for kind in ("retry-and-skip", "retry-and-dead-letter"):  # tag projections take every strategy
        tw = TagWorker(None, JournalSettings.load(env={}), "t", "tag", project, recovery=kind)  # type: ignore[arg-type]
        assert tw.recovery.kind == kind


@pytest.mark.parametrize(
    ("mode", "strategy"),
    [("grouped", "retry-and-dead-letter"), ("exactly-once", "retry-and-dead-letter"),
     ("at-least-once", "retry-and-dead-letter"), ("grouped", "retry-and-skip")],
)  # fmt: skip
async def test_tag_projections_isolate_skip_and_dead_letter(
    journal: Journal, conn: asyncpg.Connection, dsn: str, mode: str, strategy: str
) -> None:
    """The strategy comes from the global default (JOURNAL_PROJECTION_HANDLER_RECOVERY), which
    made every tag worker raise before (issue 32)."""
    settings = JournalSettings.load(
        env={"JOURNAL_PROJECTION_HANDLER_RECOVERY": strategy}, dsn=dsn, lease_ttl=1.5, lease_renew_interval=0.3,
        handler_backoff=0.01, heartbeat_offset_interval=0.5, handler_attempts=2, eventual_consistency_delay=0.0,
    )  # fmt: skip
    poison = {(2, 1), (4, 2)}
    for r in range(3):
        for i in range(6):
            await journal.persist(f"TG|p{i}", [{"n": r, "poison": (i, r) in poison}], tags=["tdl"])
    everything = {(f"TG|p{i}", r + 1) for i in range(6) for r in range(3)}
    poisoned = {("TG|p2", 2), ("TG|p4", 3)}
    seen: set[tuple[str, int]] = set()

    async def one(c: Any, env: EventEnvelope) -> None:
        await project(c, [env])

    async def alone(env: EventEnvelope) -> None:  # at-least-once: no transaction of ours
        if env.event.get("poison"):
            raise ValueError(f"cannot handle {env.persistence_id} #{env.seq_nr}")
        seen.add((env.persistence_id, env.seq_nr))

    handlers: dict[str, Callable[..., Awaitable[None]]] = {
        "grouped": project,
        "exactly-once": one,
        "at-least-once": alone,
    }
    handler = handlers[mode]
    name = f"tdl-{mode}-{strategy}"
    w = TagWorker(journal, settings, name, "tdl", handler, mode)
    assert w.recovery.kind == strategy

    async def applied() -> set[tuple[str, int]]:
        return seen if mode == "at-least-once" else await projected(conn)

    await run_until(w, lambda: _applied(applied, everything - poisoned))  # type: ignore[arg-type]
    assert await applied() == everything - poisoned
    letters = await DEAD.letters(conn, name)
    if strategy == "retry-and-dead-letter":
        assert {(d.persistence_id, d.seq_nr) for d in letters} == poisoned
        assert {d.projection_key for d in letters} == {"tag:tdl"} and all(d.attempts == 2 for d in letters)
        assert w.stats.dead_lettered == 2
    else:
        assert letters == [] and w.stats.skipped == 2
    stored = await TagOffsetSql("public").load(conn, name, "tdl")
    assert stored.seq_nrs == {f"TG|p{i}": 3 for i in range(6)}  # past the poisoned events too
    if strategy == "retry-and-dead-letter" and mode != "at-least-once":
        result = await retry(journal, conn, DEAD, name, project_fixed, "grouped")
        assert {(d.persistence_id, d.seq_nr) for d in result.applied} == poisoned
        assert await projected(conn) == everything


async def _applied(applied: Any, expected: set[tuple[str, int]]) -> bool:
    return bool(expected <= await applied())


async def _has(conn: asyncpg.Connection, expected: set[tuple[str, int]]) -> bool:
    return expected <= await projected(conn)


def _metric(name: str, projection: str) -> float:
    return sum(
        s.value
        for m in REGISTRY.collect()
        for s in m.samples
        if s.name == name and s.labels.get("projection") == projection
    )


def _cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "projections", *args, "--dsn", dsn], capture_output=True, text=True, timeout=120,
        env={**os.environ, **FAST_ENV},
    )  # fmt: skip


async def test_worker_process_under_load_dead_letters_the_poison_and_the_cli_retries_it(
    journal: Journal, conn: asyncpg.Connection, dsn: str
) -> None:
    """A worker process (grouped handler) under concurrent writes: one poisoned event ends in the
    dead-letter table with the offset past it, every other event is applied exactly once, and
    ``projections dead-letters retry`` with the fixed handler applies it (once)."""
    et, name = "DLP", "dl-process"
    on_failure = ["--on-failure", "retry-and-dead-letter:2"]
    worker = spawn_worker(dsn, name, et, "tests.poison_handler:project", extra=on_failure)
    written: set[tuple[str, int]] = set()
    stop_writing = asyncio.Event()

    async def writer(i: int) -> None:  # the write load: 20 pids appending until told to stop
        pid, n = f"{et}|w{i}", 0
        while not stop_writing.is_set():
            n += 1
            await journal.persist(pid, [{"n": n, "poison": i == 7 and n == 40}], expected_seq_nr=n - 1)
            written.add((pid, n))

    writers = [asyncio.create_task(writer(i)) for i in range(20)]
    try:
        await wait_until(lambda: _count_at_least(conn, 1500), 90, "the worker under way")
        await wait_until(lambda: _letters(conn, name), 60, "the dead letter")
        stop_writing.set()
        await asyncio.gather(*writers)
        poison = {(f"{et}|w7", 40)}
        await wait_until(lambda: _has(conn, written - poison), 90, "every other event projected")
        assert await projected(conn) == written - poison  # exactly once: a primary key
        letters = await DEAD.letters(conn, name)
        assert [(d.persistence_id, d.seq_nr, d.attempts) for d in letters] == [(f"{et}|w7", 40, 2)]
        stored = await SQL.load_pid(conn, name, slice_for(f"{et}|w7"), f"{et}|w7")
        assert stored is not None and stored[0] > 40  # the offset moved past it
        status = await asyncio.to_thread(_cli, dsn, "status", name, "--json")
        assert json.loads(status.stdout)[0]["dead_letters"] == 1
        listed = await asyncio.to_thread(_cli, dsn, "dead-letters", "list", name)
        assert f"{et}|w7 #40" in listed.stdout and "Poisoned" in listed.stdout
    finally:
        stop_writing.set()
        await asyncio.gather(*writers, return_exceptions=True)
        stop([worker])
    fixed = ["dead-letters", "retry", name, "--handler", "tests.poison_handler:project_fixed"]
    done = await asyncio.to_thread(_cli, dsn, *fixed)
    assert done.returncode == 0, done.stderr
    assert "applied 1, failed 0" in done.stdout
    assert await projected(conn) == written
    assert await DEAD.letters(conn, name) == []
    again = await asyncio.to_thread(_cli, dsn, *fixed)
    assert again.returncode == 0 and "applied 0" in again.stdout


async def _count_at_least(conn: asyncpg.Connection, n: int) -> bool:
    return int(await conn.fetchval("SELECT count(*) FROM poison_projected")) >= n


async def _letters(conn: asyncpg.Connection, name: str) -> bool:
    return bool(await DEAD.letters(conn, name))
