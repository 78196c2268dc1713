"""The fault run of state projections (issue 34, faults): kill -9 of ``projections run --states``
workers, a database crash and lost answers (tests/support/relay.py), all during one load of
upserts over many ids. The exactly-once read model must end with every id's latest revision,
no revision delivered twice or going backwards in it, and every upsert whose answer was lost
resolved as written or not written (never guessed: each writer's revisions end equal to the
store's, and no writer ever meets a conflict on ids that only it writes).

The size is the issue's by default (100,000 upserts written over 10,000 ids: ~25 s on the shared
2-core machine); ``SJ_STATE_FAULT_UPSERTS=N`` runs N over N / 10 ids. The faults come at fixed
fractions of the load, each once the projection has moved on since the previous one.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from typing import Any

import asyncpg
import pytest
from projection_helpers import spawn_worker, stop

from journal import (
    DurableState,
    JournalError,
    JournalSettings,
    JournalUnavailable,
    RevisionConflict,
    StateWritten,
    open_journal,
)
from journal.postgres.dsn import asyncpg_dsn
from journal.postgres.migrations import upgrade
from tests.state_handlers import TABLES
from tests.support.private_server import crash
from tests.support.relay import Relay, relay_to
from tests.support.waiting import wait_until

UPSERTS = int(os.environ.get("SJ_STATE_FAULT_UPSERTS", "100000"))
IDS = max(100, UPSERTS // 10)
WRITERS, PER_CALL = 4, 100
ET, NAME = "StFault", "st-faults"
WORKER_ARGS = (
    "tests.state_handlers:project",
    "exactly-once",
    ["--states"],
    {"JOURNAL_PROJECTION_OFFSET_TIME_WINDOW": "0.05"},
)


class Load:
    """WRITERS writers, each the only writer of its ids (id % WRITERS), upserting random ids of
    its own with ``upsert_many`` at each id's next revision, through the relay. Each writer knows
    its ids' revisions, so every outcome can be checked: a conflict would be an outcome guessed
    wrong earlier; an unknown outcome (the call raised) is resolved by reading the ids back."""

    def __init__(self, store: DurableState) -> None:
        self.store = store
        self.revision: dict[str, int] = {}
        self.value: dict[str, dict[str, int]] = {}
        self.sent = 0
        self.outcomes: Counter[str] = Counter()
        self.conflicts: list[RevisionConflict] = []
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        await asyncio.gather(*(self._writer(k) for k in range(WRITERS)))

    async def _writer(self, k: int) -> None:
        rng = random.Random(k)
        mine = [f"{ET}|s{i}" for i in range(k, IDS, WRITERS)]
        while not self.stopping.is_set():
            parts = [(p, self.revision.get(p, 0) + 1, {"w": k, "r": self.revision.get(p, 0) + 1})
                     for p in rng.sample(mine, PER_CALL)]  # fmt: skip
            self.sent += len(parts)
            try:
                outcomes: list[Any] = await self.store.upsert_many(parts)
            except JournalUnavailable as e:  # the database down (not sent), or sent and not read back
                self.outcomes["raised, unknown" if e.outcome_unknown else "raised, not written"] += len(parts)
                if not e.outcome_unknown:
                    await asyncio.sleep(0.2)  # the load's pace while the database is down
                outcomes = await self._read_back(parts) if e.outcome_unknown else [e] * len(parts)
            for (pid, rev, value), outcome in zip(parts, outcomes, strict=True):
                self._settle(pid, rev, value, outcome)

    def _settle(self, pid: str, rev: int, value: dict[str, int], outcome: Any) -> None:
        if type(outcome) is StateWritten:
            self.revision[pid], self.value[pid] = rev, value
            self.outcomes["written"] += 1
        elif type(outcome) is RevisionConflict:
            self.conflicts.append(outcome)
        elif type(outcome) is JournalUnavailable and not outcome.outcome_unknown:
            self.outcomes["known not written"] += 1
        else:
            raise AssertionError(f"{pid} #{rev}: an outcome neither written nor not written: {outcome!r}")

    async def _read_back(self, parts: list[tuple[str, int, dict[str, int]]]) -> list[Any]:
        """The writer's own resolution of a call that raised: each id read back (waiting out the
        outage: the load's back-off), at our revision with our value or at the one before."""
        out: list[Any] = []
        for pid, rev, value in parts:
            while True:
                try:
                    got = await self.store.get(pid)
                    break
                except JournalError:
                    await asyncio.sleep(0.2)  # the load's pace while the database is down
            found = got.revision if got else 0
            if found == rev and got is not None and got.value == value:
                self.outcomes["of those, read back written"] += 1
                out.append(StateWritten(pid, rev, got.db_timestamp))
            elif found == rev - 1:
                self.outcomes["of those, read back not written"] += 1
                out.append(JournalUnavailable("read back: not written", outcome_unknown=False))
            else:
                out.append(RevisionConflict(pid, rev, found))
        return out


async def _lose_answers(relay: Relay, n: int) -> None:
    """Lose the server's next ``n`` answers (each cuts its connection), one after another."""
    for _ in range(n):
        before = relay.lost_answers
        relay.losing = True
        await wait_until(lambda: relay.lost_answers > before, 30, "an answer lost")  # noqa: B023
        relay.losing = False


async def _logged(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM state_log"))


class Progress:
    """The projection's progress, asked on a connection of its own each time (the database may
    have crashed since the last question)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = asyncpg_dsn(dsn)
        self.mark = 0

    async def _ask(self, sql: str) -> int:
        conn = await asyncpg.connect(self.dsn)
        try:
            return int(await conn.fetchval(sql))
        finally:
            await conn.close()

    async def owners(self) -> int:
        return await self._ask(
            "SELECT count(DISTINCT owner) FROM projection_slice_lease"
            f" WHERE projection_name = '{NAME}' AND expires_at > clock_timestamp()"
        )

    async def moved_on(self) -> bool:
        """More changes delivered than at the last mark (then marks the new count)."""
        n = await self._ask("SELECT count(*) FROM state_log")
        if n > self.mark:
            self.mark = n
            return True
        return False


async def _view_is_the_store(conn: asyncpg.Connection) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT NOT EXISTS (SELECT persistence_id, revision FROM durable_state WHERE entity_type = $1"
            " EXCEPT SELECT pid, revision FROM state_view)"
            " AND (SELECT count(*) FROM state_view) = (SELECT count(*) FROM durable_state WHERE entity_type = $1)",
            ET,
        )
    )


async def _faults(conn: asyncpg.Connection) -> tuple[int, int]:
    """(duplicates, revisions going backwards) among the logged deliveries, in delivery order."""
    dups = await conn.fetchval("SELECT count(*) - count(DISTINCT (pid, revision)) FROM state_log")
    back = await conn.fetchval(
        "SELECT count(*) FROM (SELECT revision, lag(revision) OVER (PARTITION BY pid ORDER BY n) AS prev"
        " FROM state_log) t WHERE prev >= revision"
    )
    return int(dups), int(back)


async def _each_holds_slices(progress: Progress) -> bool:
    return await progress.owners() == 2


def _kill(procs: list[subprocess.Popen[bytes]], i: int, dsn: str) -> None:
    procs[i].send_signal(signal.SIGKILL)
    procs[i].wait()
    procs[i] = spawn_worker(dsn, NAME, ET, *WORKER_ARGS)


@pytest.mark.timeout(900)
async def test_state_projection_through_kill_9_a_crash_and_lost_answers(private_server: Any) -> None:
    dsn = private_server.get_uri()
    await asyncio.to_thread(upgrade, dsn)
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    await conn.execute(TABLES)
    await conn.close()
    procs = [spawn_worker(dsn, NAME, ET, *WORKER_ARGS), spawn_worker(dsn, NAME, ET, *WORKER_ARGS)]
    progress = Progress(dsn)
    t0 = time.monotonic()
    try:
        await wait_until(lambda: _each_holds_slices(progress), 120, "both workers holding slices")
        async with relay_to(dsn) as relay:
            through = relay.dsn_through(dsn)
            settings = JournalSettings.load(
                env={}, dsn=through, attempts=3, initial_backoff=0.05, max_backoff=0.2, connect_timeout=1.0
            )
            async with open_journal(through, settings=settings, migrate=False) as j:
                load = Load(j.durable_state())
                writing = asyncio.create_task(load.run())

                async def past(fraction: float) -> bool:
                    if writing.done():
                        writing.result()
                    return load.outcomes["written"] >= fraction * UPSERTS

                try:
                    await wait_until(lambda: past(0.2), 300, "a fifth of the load")
                    await wait_until(progress.moved_on, 120, "the projection under way")
                    _kill(procs, 0, dsn)
                    await wait_until(lambda: past(0.4), 300, "two fifths of the load")
                    await _lose_answers(relay, 3)
                    await wait_until(lambda: past(0.6), 300, "three fifths of the load")
                    await asyncio.to_thread(crash, private_server)
                    await asyncio.to_thread(private_server.ensure_postgres_running)
                    await wait_until(lambda: past(0.8), 300, "four fifths of the load")
                    await wait_until(progress.moved_on, 120, "the projection going on after the crash")
                    _kill(procs, 1, dsn)
                    await _lose_answers(relay, 2)
                    await wait_until(lambda: past(1.0), 300, "the whole load")
                finally:
                    load.stopping.set()
                    await writing
                lost = relay.lost_answers
        loaded = time.monotonic() - t0
        conn = await asyncpg.connect(asyncpg_dsn(dsn))
        try:
            await wait_until(lambda: _view_is_the_store(conn), 300, "every id's latest revision in the read model")
            faults = await _faults(conn)
            rows = await conn.fetch(
                "SELECT persistence_id, revision, state_payload FROM durable_state WHERE entity_type = $1", ET
            )
            stored = {r[0]: (r[1], json.loads(r[2])) for r in rows}
            delivered = await _logged(conn)
        finally:
            await conn.close()
    finally:
        stop(procs)
    print(
        f"\n{load.sent} upserts sent over {IDS} ids: {dict(load.outcomes)}; {lost} answers lost; "
        f"{delivered} changes delivered; load {loaded:.1f} s, caught up {time.monotonic() - t0 - loaded:.1f} s later"
    )
    assert load.outcomes["written"] >= UPSERTS and lost >= 5
    assert load.conflicts == [], "an outcome was guessed wrong: its id's next revision was refused"
    assert faults == (0, 0), "(duplicates, revisions going backwards) in the read model's log"
    assert stored == {p: (r, load.value[p]) for p, r in load.revision.items()}, "the writers' view is the store's"
