"""Review findings of the projection runner: each test fails without its fix."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest

from journal import EventEnvelope, Journal, JournalSettings, open_journal
from journal.ids import slice_for
from projections import Worker
from tests.support.waiting import wait_until


@pytest.fixture
async def seen(journal: Journal, dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    await c.execute("CREATE TABLE IF NOT EXISTS t_review (pid TEXT, seq BIGINT)")
    await c.execute("TRUNCATE t_review")
    yield c
    await c.close()


async def record(conn: Any, envs: Sequence[EventEnvelope]) -> None:
    await conn.executemany("INSERT INTO t_review VALUES ($1, $2)", [(e.persistence_id, e.seq_nr) for e in envs])


def same_slice_pids(et: str) -> tuple[str, str]:
    first = f"{et}|a0"
    for i in range(1, 100_000):
        pid = f"{et}|b{i}"
        if slice_for(pid) == slice_for(first):
            return first, pid
    raise AssertionError("no pid shares a slice")


async def test_backtracking_mode_delivers_a_late_new_pid_behind_its_slice_offset(
    journal: Journal, seen: asyncpg.Connection, dsn: str
) -> None:
    """A first event committed late (found by backtracking, behind the slice's stored offset)
    is an event never processed: it must not be skipped as covered by the slice offset."""
    settings = JournalSettings.load(
        env={}, dsn=dsn, mode="backtracking", refresh_interval=0.1, behind_current_time=0.05,
        backtracking_behind_current_time=0.3, heartbeat_interval=0.2, lease_ttl=1.5,
        lease_renew_interval=0.3, heartbeat_offset_interval=0.2,
    )  # fmt: skip
    early, late = same_slice_pids("RvLate")
    async with open_journal(settings=settings) as bj:
        w = Worker(bj, settings, "p-review-late", "RvLate", record, "grouped")
        task = asyncio.create_task(w.run())
        holder = await asyncpg.connect(dsn)
        try:
            tx = holder.transaction()
            await tx.start()
            await bj.persist_in(holder, late, [{"n": 1}])  # timestamped now, committed later
            await bj.persist(early, [{"n": 1}])
            await bj.persist(early, [{"n": 2}])

            async def early_done() -> bool:
                return await seen.fetchval("SELECT count(*) FROM t_review WHERE pid = $1", early) == 2

            await wait_until(early_done, 20, "the early pid projected (slice offset past the late event)")
            await tx.commit()

            async def late_done() -> bool:
                return await seen.fetchval("SELECT count(*) FROM t_review WHERE pid = $1", late) == 1

            await wait_until(late_done, 20, "the late event projected")
        finally:
            await holder.close()
            w.stop()
            await task


def _late_commit_settings(dsn: str) -> JournalSettings:
    # backtracking_behind_current_time is longer than the late transaction stays open: the commit
    # is within the mode's assumption, so the query's own heartbeats stay below the late event.
    return JournalSettings.load(
        env={}, dsn=dsn, mode="backtracking", refresh_interval=0.1, behind_current_time=0.05,
        backtracking_behind_current_time=30.0, heartbeat_interval=0.2, lease_ttl=1.5,
        lease_renew_interval=0.3, heartbeat_offset_interval=0.2,
    )  # fmt: skip


async def _late_commit_across_a_restart(
    seen: asyncpg.Connection, dsn: str, name: str, entity_type: str, early: str, late: str
) -> tuple[Any, Any]:
    """Hold ``late``'s first event uncommitted while a worker projects ``early``'s two events,
    stop that worker, commit, and let a new worker (a restart or a rebalance) resume from the
    stored offsets. Returns (the late event's db_timestamp, the highest stored offset of its
    slice before the commit); the late event must end up projected exactly once."""
    settings = _late_commit_settings(dsn)

    async def count(pid: str) -> int:
        return int(await seen.fetchval("SELECT count(*) FROM t_review WHERE pid = $1", pid))

    async with open_journal(settings=settings) as bj:
        holder = await asyncpg.connect(dsn)
        try:
            tx = holder.transaction()
            await tx.start()
            [pending] = await bj.persist_in(holder, late, [{"n": 1}])  # timestamped now, committed later
            await bj.persist(early, [{"n": 1}, {"n": 2}])
            first = Worker(bj, settings, name, entity_type, record, "grouped")
            task = asyncio.create_task(first.run())
            try:
                await wait_until(lambda: _eq(count(early), 2), 20, "the early pid projected")
            finally:
                first.stop()
                await task
            # the early events' offsets committed with any heartbeat rows of the batch
            above = await seen.fetchval(
                "SELECT max(timestamp_offset) FROM projection_timestamp_offset_store "
                "WHERE projection_name = $1 AND slice = $2",
                name, slice_for(late),
            )  # fmt: skip
            await tx.commit()
        finally:
            await holder.close()
        second = Worker(bj, settings, name, entity_type, record, "grouped")
        task = asyncio.create_task(second.run())
        try:
            await wait_until(lambda: _eq(count(late), 1), 20, "the late event projected by the new owner")
            assert await count(early) == 2
        finally:
            second.stop()
            await task
    return pending.db_timestamp, above


async def test_backtracking_mode_keeps_idle_slice_offsets_below_a_late_commit(
    journal: Journal, seen: asyncpg.Connection, dsn: str
) -> None:
    """In backtracking mode delivery is not ordered by db_timestamp: an idle slice must not get a
    heartbeat row at a delivered event's timestamp while an older event of it has not committed,
    or the next owner resumes past that event and never projects it."""
    early, late = "RvHb|early", "RvHb|late"
    assert slice_for(early) != slice_for(late)
    late_ts, above = await _late_commit_across_a_restart(seen, dsn, "p-review-hb", "RvHb", early, late)
    assert above is None or above < late_ts, (above, late_ts)


async def test_backtracking_mode_delivers_a_late_commit_below_its_own_slice_offset_after_a_restart(
    journal: Journal, seen: asyncpg.Connection, dsn: str
) -> None:
    """The late pid and the early pid share a slice, so the slice's stored offset (the early
    events') lies above the late event: after a restart the late pid, unknown to the validator,
    must be judged by its own record in the offset store (none: seq_nr 1 is new), not by the
    slice offset (which would drop it as a duplicate)."""
    early, late = same_slice_pids("RvSame")
    assert slice_for(early) == slice_for(late)
    late_ts, above = await _late_commit_across_a_restart(seen, dsn, "p-review-same", "RvSame", early, late)
    assert above is not None and above > late_ts, (above, late_ts)


async def _eq(value: Any, expected: int) -> bool:
    return bool(await value == expected)
