"""Stateful writers and processors recover their state before they process, across restarts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import asyncpg
import pytest

from journal import EventEnvelope, Journal, JournalSettings
from journal.entities import StatefulProcessor, StatefulWriter, WriterHandler
from journal.errors import HandlerFailed
from projections import Worker
from projections.management import processed_up_to
from tests.support.waiting import wait_until


def fast(dsn: str, **more: Any) -> JournalSettings:
    return JournalSettings.load(
        env={}, dsn=dsn, lease_ttl=1.5, lease_renew_interval=0.3, handler_backoff=0.02, **more
    )  # fmt: skip


class TotalWriter(StatefulWriter[int]):
    """State: the running total of every amount consumed; each row stores the total after it."""

    def __init__(self, source: Journal, dsn: str, fail_on_write: int | None = None) -> None:
        super().__init__(source, "amount")
        self.dsn = dsn
        self.writes = 0
        self.fail_on_write = fail_on_write  # raise after this write() committed

    def initial_state(self) -> int:
        return 0

    def on_event(self, state: int, envelope: EventEnvelope) -> int:
        return state + int(envelope.event["n"])

    async def read(self, persistence_ids: Sequence[str]) -> Mapping[str, int]:
        conn = await asyncpg.connect(self.dsn)
        try:
            rows = await conn.fetch("SELECT pid, seq FROM t_progress WHERE pid = ANY($1::text[])", [*persistence_ids])
        finally:
            await conn.close()
        return {r["pid"]: r["seq"] for r in rows}

    async def write(self, events: Sequence[EventEnvelope], progress: Mapping[str, int]) -> None:
        self.writes += 1
        conn = await asyncpg.connect(self.dsn)
        try:
            async with conn.transaction():
                await conn.execute("INSERT INTO t_totals VALUES ($1)", self.state)
                await conn.executemany(
                    "INSERT INTO t_progress VALUES ($1, $2) ON CONFLICT (pid) DO UPDATE SET seq = EXCLUDED.seq",
                    list(progress.items()),
                )
        finally:
            await conn.close()
        if self.fail_on_write == self.writes:
            raise RuntimeError("failed after the commit: the outcome is unknown to the handler")


@pytest.fixture
async def conn(journal: Journal, dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    await c.execute("CREATE TABLE IF NOT EXISTS t_totals (total BIGINT)")
    await c.execute("CREATE TABLE IF NOT EXISTS t_progress (pid TEXT PRIMARY KEY, seq BIGINT NOT NULL)")
    await c.execute("TRUNCATE t_totals, t_progress")
    yield c
    await c.close()


async def run_until(worker: Worker, cond: Any, what: str) -> None:
    task = asyncio.create_task(worker.run())
    try:
        await wait_until(cond, 30, what)
    finally:
        worker.stop()
        await task


async def test_stateful_writer_recovers_its_state_after_a_restart(
    journal: Journal, dsn: str, conn: asyncpg.Connection
) -> None:
    for p, ns in (("a", [1, 2, 3]), ("b", [10, 20])):
        await journal.persist(f"amount|{p}", [{"n": n} for n in ns])
    settings = fast(dsn, group_size=10)
    first = TotalWriter(journal, dsn)

    async def total_is(n: int) -> bool:
        return await conn.fetchval("SELECT max(total) FROM t_totals") == n

    await run_until(Worker(journal, settings, "totals", "amount", WriterHandler(first), "grouped"),
                    lambda: total_is(36), "the first run")  # fmt: skip
    assert first.replayed == 0 and first.state == 36

    await journal.persist("amount|a", [{"n": 100}], expected_seq_nr=3)
    await journal.persist("amount|c", [{"n": 1000}])
    second = TotalWriter(journal, dsn)  # restarted: recovers 36 before it processes anything
    await run_until(Worker(journal, settings, "totals", "amount", WriterHandler(second), "grouped"),
                    lambda: total_is(1136), "the restarted writer")  # fmt: skip
    assert second.replayed == 5 and second.state == 1136


async def test_stateful_writer_rebuilds_state_after_a_failed_write(
    journal: Journal, dsn: str, conn: asyncpg.Connection
) -> None:
    await journal.persist("amount|x", [{"n": n} for n in (1, 2, 3, 4)])
    settings = fast(dsn, group_size=2, handler_attempts=1)
    failing = TotalWriter(journal, dsn, fail_on_write=1)
    failing.batch_size = 2
    with pytest.raises(HandlerFailed):
        worker = Worker(journal, settings, "totals2", "amount", WriterHandler(failing), "grouped")
        await asyncio.wait_for(worker.run(), 30)
    assert failing.recovered is False  # its state may hold unwritten events: rebuilt before use

    again = TotalWriter(journal, dsn)
    await run_until(Worker(journal, settings, "totals2", "amount", WriterHandler(again), "grouped"),
                    lambda: _max_total(conn, 10), "the retried writer")  # fmt: skip
    assert again.replayed == 2 and again.state == 10  # 1+2 recovered, 3+4 applied once


async def _max_total(conn: asyncpg.Connection, n: int) -> bool:
    return await conn.fetchval("SELECT max(total) FROM t_totals") == n


def every_second(state: dict[str, int], env: EventEnvelope) -> tuple[dict[str, int], list[Any]]:
    """Counts events per source pid; outputs only on every second one (so some leave no trace)."""
    n = state.get(env.persistence_id, 0) + 1
    return {**state, env.persistence_id: n}, ([{"src": env.persistence_id, "count": n}] if n % 2 == 0 else [])


def counter_processor(journal: Journal) -> StatefulProcessor[dict[str, int]]:
    return StatefulProcessor(journal, "src", journal, "pairs", "pair", every_second, dict, batch_size=10)


async def outputs(journal: Journal, pid: str) -> list[int]:
    return [e.event["count"] async for e in journal.current_events_by_persistence_id(pid)]


async def test_stateful_processor_recovers_state_including_events_without_output(journal: Journal, dsn: str) -> None:
    await journal.persist("src|a", [{"i": i} for i in range(3)])  # counts 1, 2, 3: output at 2
    settings = fast(dsn, group_size=10)
    first = counter_processor(journal)

    def caught_up(targets: dict[str, int]) -> Any:
        return lambda: processed_up_to(settings, "pairs", targets)

    await run_until(Worker(journal, settings, "pairs", "src", WriterHandler(first), "grouped"),
                    caught_up({"src|a": 3}), "the first run")  # fmt: skip
    assert await outputs(journal, "pair|a") == [2]

    await journal.persist("src|a", [{"i": 3}], expected_seq_nr=3)  # count 4: output only if 3 was kept
    second = counter_processor(journal)
    await run_until(Worker(journal, settings, "pairs", "src", WriterHandler(second), "grouped"),
                    caught_up({"src|a": 4}), "the restarted processor")  # fmt: skip
    assert second.state == {"src|a": 4}
    assert await outputs(journal, "pair|a") == [2, 4]

    third = counter_processor(journal)  # recovery alone writes nothing again
    await third.recover()
    assert third.state == {"src|a": 4} and third.written == 0
    assert await outputs(journal, "pair|a") == [2, 4]


async def test_stateful_processor_catches_up_unwritten_output_in_recovery(journal: Journal) -> None:
    await journal.persist("src|b", [{"i": i} for i in range(4)])  # no processor has run yet
    p = counter_processor(journal)
    await p.recover()  # e.g. a crash before the first write: recovery writes the outputs
    assert p.state == {"src|b": 4} and p.written == 2
    assert await outputs(journal, "pair|b") == [2, 4]
    last = [e async for e in journal.current_events_by_persistence_id("pair|b")][-1]
    assert last.metadata == {"processor": "pairs", "source_seq_nr": 4}
