"""State projections (issue 34 item 4): the changes of durable states on the projection workers,
their offsets in the event projections' store, by revision; on real PostgreSQL, with worker
processes run by ``projections run --states``."""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from projection_helpers import spawn_worker, stop

from journal import (
    DeletedState,
    EventEnvelope,
    Journal,
    JournalSettings,
    RevisionConflict,
    StateChange,
    UpdatedState,
    open_journal,
)
from journal.ids import slice_for
from journal.offsets import TimestampOffset
from projections import StateWorker
from projections.dead_letter_store import DeadLetterSql
from projections.postgres_store import ProjectionSql
from projections.state_runner import StateValidator
from projections.validation import Validator, Verdict
from tests.state_handlers import TABLES, project, project_group
from tests.support.waiting import wait_until

SQL = ProjectionSql("public")
S = timedelta(seconds=1)
DEAD = DeadLetterSql("public")


@pytest.fixture
def fast(dsn: str) -> JournalSettings:
    return JournalSettings.load(
        env={}, dsn=dsn, lease_ttl=1.5, lease_renew_interval=0.3, handler_backoff=0.01,
        heartbeat_offset_interval=0.5, handler_attempts=2, refresh_interval=0.1,
    )  # fmt: skip


@pytest.fixture
async def conn(journal: Journal, dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    await c.execute(TABLES)
    yield c
    await c.close()


async def store_revisions(conn: asyncpg.Connection, et: str) -> dict[str, tuple[int, bool]]:
    rows = await conn.fetch(
        "SELECT persistence_id, revision, state_ser_id = 0 AS deleted FROM durable_state WHERE entity_type = $1", et
    )
    return {r[0]: (r[1], r[2]) for r in rows}


async def view_revisions(conn: asyncpg.Connection) -> dict[str, tuple[int, bool]]:
    return {r[0]: (r[1], r[2] is None) for r in await conn.fetch("SELECT pid, revision, value FROM state_view")}


async def in_view(conn: asyncpg.Connection, et: str) -> bool:
    return await view_revisions(conn) == await store_revisions(conn, et)


async def log_faults(conn: asyncpg.Connection) -> tuple[int, int]:
    """(duplicates, revisions going backwards) among the logged deliveries, in delivery order."""
    dups = await conn.fetchval("SELECT count(*) - count(DISTINCT (pid, revision)) FROM state_log")
    back = await conn.fetchval(
        "SELECT count(*) FROM (SELECT revision, lag(revision) OVER (PARTITION BY pid ORDER BY n) AS prev"
        " FROM state_log) t WHERE prev >= revision"
    )
    return int(dups), int(back)


async def write_states(journal: Journal, et: str, ids: int, revisions: int, deleted: set[int]) -> None:
    store = journal.durable_state()
    for r in range(1, revisions + 1):
        await store.upsert_many([(f"{et}|s{i}", r, {"n": i, "r": r}) for i in range(ids)])
    for i in deleted:
        await store.delete(f"{et}|s{i}", revisions + 1)


async def run_until(worker: StateWorker, cond: Any, timeout: float = 30) -> None:  # noqa: ASYNC109
    task = asyncio.create_task(worker.run())

    async def done() -> bool:
        if task.done():
            task.result()
        return bool(await cond())

    try:
        await wait_until(done, timeout, "the state projection")
    finally:
        worker.stop()
        await task


def change(pid: str, revision: int, ts: datetime, slice_: int = 7) -> EventEnvelope:
    return EventEnvelope(pid, "T", slice_, revision, ts, {"r": revision}, TimestampOffset(ts, {pid: revision}))


T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_change_is_admitted_by_its_revision_and_a_skipped_revision_is_no_gap() -> None:
    """The event validator says GAP for 5 after 3 (the runner would replay 4 from the journal,
    which a state does not have) and UNKNOWN for a first sight at revision 3; the state
    validator accepts both, and drops what is at or below the pid's revision."""
    v = StateValidator(timedelta(seconds=60))
    v.load_slice(7, T0, [("T|a", 3, T0)])
    assert Validator(timedelta(seconds=60)).check(change("T|b", 3, T0 + S)).verdict is Verdict.UNKNOWN
    events = Validator(timedelta(seconds=60))
    events.load_slice(7, T0, [("T|a", 3, T0)])
    assert events.check(change("T|a", 5, T0 + S)).verdict is Verdict.GAP
    assert v.check(change("T|a", 5, T0 + S)).verdict is Verdict.ACCEPT
    assert v.check(change("T|a", 3, T0)).verdict is Verdict.DUPLICATE
    assert v.check(change("T|b", 3, T0 + S)).verdict is Verdict.ACCEPT
    # horizon mode: a pid not in memory below the slice offset was delivered at a later revision
    assert v.check(change("T|c", 2, T0 - S)).verdict is Verdict.DUPLICATE
    # backtracking mode: a late commit below the offset is new within the window, asked for beyond it
    assert v.check(change("T|c", 2, T0 - S), per_pid=True).verdict is Verdict.ACCEPT
    assert v.check(change("T|c", 2, T0 - 120 * S), per_pid=True).verdict is Verdict.UNKNOWN


@pytest.mark.parametrize(
    ("mode", "query_mode"), [("exactly-once", "horizon"), ("grouped", "horizon"), ("grouped", "backtracking")]
)
async def test_every_latest_revision_and_every_delete_reach_the_read_model(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings, dsn: str, mode: str, query_mode: str
) -> None:
    et = "StCart"
    await write_states(journal, et, 40, 3, {3, 17})
    handler = project if mode == "exactly-once" else project_group
    async with open_journal(dsn, settings=replace(fast, query=replace(fast.query, mode=query_mode))) as j:
        w = StateWorker(j, j.settings, f"st-{mode}", et, handler, mode)
        await run_until(w, lambda: in_view(conn, et))
        await _then_new_revisions_only(j, conn, et, handler, mode)


async def _then_new_revisions_only(j: Journal, conn: asyncpg.Connection, et: str, handler: Any, mode: str) -> None:
    view = await view_revisions(conn)
    assert view[f"{et}|s3"] == (4, True) and view[f"{et}|s0"] == (3, False)  # a delete is delivered
    assert await log_faults(conn) == (0, 0)
    assert await conn.fetchval("SELECT count(*) FROM state_log") == 40  # the latest revision of each, once
    # the offsets are in the event projections' store, the revision in its seq_nr column
    assert await SQL.load_pid(conn, f"st-{mode}", slice_for(f"{et}|s3"), f"{et}|s3") is not None
    stored = await SQL.load_pid(conn, f"st-{mode}", slice_for(f"{et}|s3"), f"{et}|s3")
    assert stored is not None and stored[0] == 4

    # new revisions after a restart: only they are delivered (admission by revision), a skipped
    # revision is no gap (s0: 4 and 5 written, 5 delivered)
    await j.durable_state().upsert(f"{et}|s0", 4, {"n": 0, "r": 4})
    await j.durable_state().upsert(f"{et}|s0", 5, {"n": 0, "r": 5})
    await j.durable_state().upsert(f"{et}|s3", 5, {"n": 3, "r": 5})
    w = StateWorker(j, j.settings, f"st-{mode}", et, handler, mode)
    await run_until(w, lambda: in_view(conn, et))
    assert await log_faults(conn) == (0, 0)
    assert await conn.fetchval("SELECT count(*) FROM state_log") == 42
    # a restart that keeps no pid in memory (an offset window of 1 µs): the slice offsets drop what the
    # query reads again
    s = replace(j.settings, projection=replace(j.settings.projection, offset_time_window=1e-6))
    await j.durable_state().upsert(f"{et}|s1", 4, {"n": 1, "r": 4})
    w = StateWorker(j, s, f"st-{mode}", et, handler, mode)
    await run_until(w, lambda: in_view(conn, et))
    assert await log_faults(conn) == (0, 0)
    assert await conn.fetchval("SELECT count(*) FROM state_log") == 43


async def test_an_at_least_once_handler_gets_updated_and_deleted_states(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings
) -> None:
    et = "StAlo"
    await write_states(journal, et, 20, 2, {5})
    seen: dict[str, StateChange] = {}

    async def handler(change: StateChange) -> None:
        seen[change.persistence_id] = change

    w = StateWorker(journal, fast, "st-alo", et, handler, "at-least-once")

    async def all_seen() -> bool:
        return {p: (c.revision, type(c) is DeletedState) for p, c in seen.items()} == await store_revisions(conn, et)

    await run_until(w, all_seen)
    assert type(seen[f"{et}|s5"]) is DeletedState and seen[f"{et}|s5"].revision == 3
    first = seen[f"{et}|s0"]
    assert type(first) is UpdatedState and first.value == {"n": 0, "r": 2}


async def test_a_failing_handler_is_retried_then_its_change_dead_lettered(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings
) -> None:
    et = "StPoison"
    store = journal.durable_state()
    await store.upsert_many([(f"{et}|s{i}", 1, {"n": i, "poison": i in (4, 9)}) for i in range(16)])
    w = StateWorker(journal, fast, "st-dl", et, project_group, "grouped", recovery="retry-and-dead-letter")

    async def rest_projected() -> bool:
        view = await view_revisions(conn)
        return len(view) == 14

    await run_until(w, rest_projected)
    letters = await DEAD.letters(conn, "st-dl")
    assert {(d.persistence_id, d.seq_nr) for d in letters} == {(f"{et}|s4", 1), (f"{et}|s9", 1)}
    assert all(d.attempts == 2 and "cannot handle" in d.error for d in letters)
    assert w.stats.dead_lettered == 2
    stored = await SQL.load_pid(conn, "st-dl", slice_for(f"{et}|s4"), f"{et}|s4")
    assert stored is not None and stored[0] == 1  # the offset moved past it

    # the poisoned state is fixed by a new revision: delivered, as any change
    await store.upsert(f"{et}|s4", 2, {"n": 4})
    w = StateWorker(journal, fast, "st-dl", et, project_group, "grouped", recovery="retry-and-dead-letter")
    await run_until(w, lambda: _view_has(conn, f"{et}|s4", 2))
    assert await log_faults(conn) == (0, 0)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "projections", "dead-letters", *args], capture_output=True, text=True, timeout=60
    )


async def test_dead_letters_of_a_state_projection_retried_and_discarded(
    journal: Journal, conn: asyncpg.Connection, fast: JournalSettings, dsn: str
) -> None:
    """``projections dead-letters retry NAME --states``: a letter whose state is still at its
    revision is applied with the fixed handler (in the transaction that takes it); one whose pid
    has a later revision is superseded (taken, not applied: the read model never goes back to
    it); one whose state was hard deleted is missing (kept, exit 1) until ``discard``. Before:
    retry read the letters' events from the journal and applied none ('not in the journal')."""
    et, name = "StDlr", "st-dlr"
    store = journal.durable_state()
    await store.upsert_many([(f"{et}|s{i}", 1, {"n": i, "poison": i in (4, 9, 12)}) for i in range(16)])
    w = StateWorker(journal, fast, name, et, project_group, "grouped", recovery="retry-and-dead-letter")
    await run_until(w, lambda: _view_size(conn, 13))
    await store.upsert(f"{et}|s9", 2, {"n": 9})
    await store.hard_delete(f"{et}|s12")
    w = StateWorker(journal, fast, name, et, project_group, "grouped", recovery="retry-and-dead-letter")
    await run_until(w, lambda: _view_has(conn, f"{et}|s9", 2))

    retried = _cli("retry", name, "--states", "--handler", "tests.state_handlers:project_fixed", "--dsn", dsn)
    assert retried.returncode == 1, retried.stderr
    assert retried.stdout.strip().splitlines()[-1] == (
        f"applied 1, failed 0, waiting 0, missing 1, superseded 1 dead letters of {name}"
    )
    assert f"superseded: {et}|s9 #1 (at revision 2 now" in retried.stdout
    assert retried.stderr.strip() == f"not in the durable state store any more: {et}|s12 #1"
    view = await view_revisions(conn)
    assert view[f"{et}|s4"] == (1, False) and view[f"{et}|s9"] == (2, False) and f"{et}|s12" not in view
    assert await conn.fetchval("SELECT count(*) FROM state_log WHERE pid = $1", f"{et}|s9") == 1  # 2 only
    assert await log_faults(conn) == (0, 0)
    assert {(d.persistence_id, d.seq_nr) for d in await DEAD.letters(conn, name)} == {(f"{et}|s12", 1)}

    discarded = _cli("discard", name, "--pid", f"{et}|s12", "--dsn", dsn)
    assert (discarded.returncode, discarded.stdout.strip()) == (0, f"discarded 1 dead letters of {name}")
    assert await DEAD.letters(conn, name) == []


async def _view_size(conn: asyncpg.Connection, n: int) -> bool:
    return len(await view_revisions(conn)) == n


async def _view_has(conn: asyncpg.Connection, pid: str, revision: int) -> bool:
    return (await view_revisions(conn)).get(pid, (0, False))[0] == revision


class Upserts:
    """Concurrent writers of random ids, each upsert at the next revision (a delete now and then)."""

    def __init__(self, journal: Journal, et: str, ids: int, writers: int) -> None:
        self.store = journal.durable_state()
        self.et, self.ids, self.writers = et, ids, writers
        self.stopping = asyncio.Event()
        self.written = 0

    async def run(self) -> None:
        await asyncio.gather(*(self._writer(k) for k in range(self.writers)))

    async def _writer(self, k: int) -> None:
        rng = random.Random(k)
        while not self.stopping.is_set():
            pids = {f"{self.et}|s{rng.randrange(self.ids)}" for _ in range(20)}
            for pid in pids:
                current = await self.store.get(pid)
                n = current.revision if current else 0
                try:
                    if rng.random() < 0.05:
                        await self.store.delete(pid, n + 1)
                    else:
                        await self.store.upsert(pid, n + 1, {"w": k, "r": n + 1})
                    self.written += 1
                except RevisionConflict:  # another writer took the revision
                    pass
            await asyncio.sleep(0)


async def _logged(conn: asyncpg.Connection, n: int) -> bool:
    return int(await conn.fetchval("SELECT count(*) FROM state_log")) >= n


async def _owners(conn: asyncpg.Connection, name: str) -> int:
    return len({r["owner"] for r in await SQL.leases.lease_owners(conn, name) if r["live"]})


async def test_kill_9_of_a_state_worker_under_concurrent_upserts_loses_and_repeats_nothing(
    journal: Journal, conn: asyncpg.Connection, dsn: str
) -> None:
    """Two ``projections run --states`` processes (exactly-once); one is killed -9 mid-run while
    upserts go on: the survivor takes its slices, the read model ends with every id's latest
    revision, no revision delivered twice or going backwards."""
    et, name = "StKill", "st-kill"
    load = Upserts(journal, et, 500, 4)
    task = asyncio.create_task(load.run())
    # a short offset window: a worker taking slices over keeps few pids in memory, so what the
    # query reads again is dropped by the slice offsets too, not only by the pids' revisions
    args = (
        "tests.state_handlers:project",
        "exactly-once",
        ["--states"],
        {"JOURNAL_PROJECTION_OFFSET_TIME_WINDOW": "0.05"},
    )
    procs: list[subprocess.Popen[bytes]] = [spawn_worker(dsn, name, et, *args), spawn_worker(dsn, name, et, *args)]
    try:
        await wait_until(lambda: _owners(conn, name), 60, "the workers to take slices")
        await wait_until(lambda: _logged(conn, 500), 60, "state projection under way")
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        n = int(await conn.fetchval("SELECT count(*) FROM state_log"))
        await wait_until(lambda: _logged(conn, n + 500), 60, "the survivor to project more")
    finally:
        load.stopping.set()
        await task
    try:
        await wait_until(lambda: in_view(conn, et), 60, "every id's latest revision in the read model")
    finally:
        stop(procs)
    assert await log_faults(conn) == (0, 0)
    assert load.written > 1000


def test_run_states_needs_an_entity_type(dsn: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "projections", "run", "p", "--tag", "t", "--states", "--handler",
         "tests.state_handlers:project", "--dsn", dsn],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .endswith("--states projects an entity type's durable states (with --entity-type and --handler)")
    )
    assert "Traceback" not in out.stderr
