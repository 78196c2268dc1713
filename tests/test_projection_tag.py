"""Projections over a tag (real PostgreSQL): exactly-once and grouped handlers, restart from the
stored TimeUUID offset with nothing twice and nothing missing, and the CLI's choice of source."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from conftest import truncate_all
from typer.testing import CliRunner

from journal import EventEnvelope, Journal, JournalSettings, open_journal
from projections.cli import app
from projections.tag_offset_store import TagOffsetSql
from projections.tag_runner import TagWorker
from tests.support.waiting import wait_until

_ZERO_V1 = uuid.UUID("00000000-0000-1000-8000-000000000000")
FAST: dict[str, Any] = dict(
    eventual_consistency_delay=0.0,
    query_refresh_interval=0.05,
    back_track_interval=0.2,
    lease_renew_interval=0.1,
    lease_ttl=2.0,
    group_max_wait=0.02,
    handler_backoff=0.02,
)


@pytest.fixture
async def tj(dsn: str) -> AsyncIterator[Journal]:
    await truncate_all(dsn)
    conn = await asyncpg.connect(dsn)
    await conn.execute("CREATE TABLE IF NOT EXISTS tag_proj_out (pid text, seq_nr bigint, PRIMARY KEY (pid, seq_nr))")
    await conn.execute("TRUNCATE tag_proj_out")
    await conn.close()
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn, **FAST)) as j:
        yield j


async def exactly_once(conn: Any, env: EventEnvelope) -> None:
    # a plain INSERT: a second delivery of an event would violate the primary key and fail
    await conn.execute("INSERT INTO tag_proj_out VALUES ($1, $2)", env.persistence_id, env.seq_nr)


async def grouped(conn: Any, envs: list[EventEnvelope]) -> None:
    await conn.executemany("INSERT INTO tag_proj_out VALUES ($1, $2)", [(e.persistence_id, e.seq_nr) for e in envs])


async def write(j: Journal, rounds: range, pids: int = 8) -> int:
    """Every pid gets one untagged and one tagged event per round (seq_nr gaps in the tag)."""
    tagged = 0
    for r in rounds:
        await asyncio.gather(*(j.persist(f"TP|p{i}", [{"r": r}]) for i in range(pids)))
        await asyncio.gather(*(j.persist(f"TP|p{i}", [{"r": r, "t": 1}], tags=["blue"]) for i in range(pids)))
        tagged += pids
    await j.persist("TP|other", [{"r": 0}], tags=["green"])
    return tagged


async def run_until(worker: TagWorker, dsn: str, count: int) -> None:
    task = asyncio.create_task(worker.run())
    conn = await asyncpg.connect(dsn)
    try:

        async def done() -> bool:
            if task.done():
                task.result()  # surface the worker's error
            n = await conn.fetchval("SELECT count(*) FROM tag_proj_out")
            return bool(n >= count)

        await wait_until(done, 20, f"{count} projected events")
    finally:
        await conn.close()
        worker.stop()
        await task


async def outputs(dsn: str) -> list[tuple[str, int]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [(r[0], r[1]) for r in await conn.fetch("SELECT pid, seq_nr FROM tag_proj_out ORDER BY 1, 2")]
    finally:
        await conn.close()


async def test_tag_projection_exactly_once_then_grouped_resumes_exactly(tj: Journal, dsn: str) -> None:
    first = await write(tj, range(3))
    w1 = TagWorker(tj, tj.settings, "blue-proj", "blue", exactly_once, "exactly-once")
    await run_until(w1, dsn, first)
    assert w1.stats.events == first and w1.stats.duplicates == 0

    second = await write(tj, range(3, 6))
    w2 = TagWorker(tj, tj.settings, "blue-proj", "blue", grouped, "grouped")
    await run_until(w2, dsn, first + second)
    # resumed after the stored offset: only the new events, none re-read
    assert w2.stats.events == second and w2.stats.duplicates == 0
    got = await outputs(dsn)
    expected = sorted((f"TP|p{i}", 2 * r + 2) for i in range(8) for r in range(6))
    assert got == expected  # exactly the tagged events (even seq_nrs), each once, no "green" one

    conn = await asyncpg.connect(dsn)
    try:
        stored = await TagOffsetSql("public").load(conn, "blue-proj", "blue")
    finally:
        await conn.close()
    assert stored.seq_nrs == {f"TP|p{i}": 12 for i in range(8)}
    last = [e async for e in tj.current_events_by_tag("blue")][-1]
    assert stored.latest == last.offset.value  # type: ignore[attr-defined]


async def test_tag_projection_drops_redelivered_events_by_seq_nr(tj: Journal, dsn: str) -> None:
    n = await write(tj, range(2))
    w1 = TagWorker(tj, tj.settings, "redo", "blue", grouped, "grouped")
    await run_until(w1, dsn, n)
    # move the stored position back (as a late re-read would): the events come again and are dropped
    conn = await asyncpg.connect(dsn)
    await conn.execute("UPDATE projection_tag_offset_store SET offset_time = 0, tag_offset = $1", _ZERO_V1)
    await conn.close()
    more = await write(tj, range(2, 3))
    w2 = TagWorker(tj, tj.settings, "redo", "blue", exactly_once, "exactly-once")
    await run_until(w2, dsn, n + more)
    assert w2.stats.events == more and w2.stats.duplicates == n
    assert len(await outputs(dsn)) == n + more


def test_cli_requires_exactly_one_source() -> None:
    r = CliRunner().invoke(app, ["run", "p", "--handler", "x:y"])
    assert r.exit_code == 2 and "exactly one of --entity-type and --tag" in r.output
    r = CliRunner().invoke(app, ["run", "p", "--handler", "x:y", "--tag", "a", "--entity-type", "E"])
    assert r.exit_code == 2


async def test_two_workers_share_one_tag_lease_exactly_once_across_handover(tj: Journal, dsn: str) -> None:
    ws = [TagWorker(tj, tj.settings, "shared", "blue", grouped, "grouped") for _ in range(2)]
    tasks = [asyncio.create_task(w.run()) for w in ws]
    conn = await asyncpg.connect(dsn)
    try:
        n = await write(tj, range(4))

        async def done() -> bool:
            for t in tasks:
                if t.done():
                    t.result()
            return bool(await conn.fetchval("SELECT count(*) FROM tag_proj_out") >= n)

        await wait_until(done, 20, f"{n} projected events")
    finally:
        await conn.close()
        for w in ws:
            w.stop()
        await asyncio.gather(*tasks)
    # one lease: at any time one worker processes the tag (a rebalance may hand it over once)
    assert sum(w.stats.events for w in ws) == n
    assert len(await outputs(dsn)) == n
