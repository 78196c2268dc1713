"""Projections against the journal's own slice read of the same rows, side by side in one run.

Writes N events once (``persist_many`` calls of 20 pids with 500 events each, as a bulk loader
would; each pid a random UUID, so the events split evenly between the workers' slice ranges:
sequential names such as ``e0 .. e599`` hash, as on the JVM, to a few runs of neighbouring slices,
and a random entity type's name then gave one worker anywhere from 10% to 90% of them), then
measures, each as a row of paired rounds against ``current_events_by_slices`` over all slices
(the "slice read": what the projection reads, with no offsets, handler or commits):

- raw asyncpg SELECT of the same rows and columns (the ceiling of both);
- grouped exactly-once (a batch and its offsets in one transaction; the handler inserts the
  batch into a table with one statement), with the default settings, then tuned;
- at-least-once (the handler keeps the newest value per pid in memory; offsets are stored every
  ``at_least_once_every`` envelopes), with the default settings, then tuned.

Each round runs the row's two sides one after the other, the order swapped every round, and the
row reports the median of the rounds' ratios (a busy moment of the shared machine hits one round
of both sides, not one side of every round), the load average before and after, and the CPU per
1,000 events of this process (client) and of the server's backends (server), which do not
depend on how busy the machine is. A projection side starts its workers on a fresh projection
name and ends when every event is committed (grouped) or handled (at-least-once: its offsets
trail by design); its workers are stopped outside the timed part.

    [JOURNAL_DSN=postgresql://...] python benchmarks/projection_throughput.py [--events N] [--rounds R]

(default 300,000 events, 3 rounds, 2 workers; a fresh database on JOURNAL_DSN's server, else an
embedded one). Both sides run on ``journal.runtime`` (uvloop, the collector tuned), as ``projections
run`` runs its workers; ``--asyncio`` runs them on ``asyncio.run`` instead.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from journal import EventEnvelope, Journal, JournalSettings, Write, failures, open_journal, runtime
from projections import Worker

try:
    from benchmarks._common import CpuMeter, fresh_database, header
except ImportError:  # run as a script from benchmarks/
    from _common import CpuMeter, fresh_database, header  # type: ignore[no-redef]

RAW = """SELECT persistence_id, entity_type, slice, seq_nr, db_timestamp, event_ser_id, event_ser_manifest,
  event_payload, writer, tags, meta_ser_id, meta_ser_manifest, meta_payload
FROM event_journal WHERE entity_type = $1 AND deleted = false ORDER BY db_timestamp, seq_nr, persistence_id"""

TUNED = {"group_size": 5000, "buffer_size": 10_000, "at_least_once_every": 5000}
"""The tuned rows' settings (the default rows take none)."""


@dataclass
class Side:
    """One side of one round: events, seconds, CPU of this process and of the server."""

    events: int
    seconds: float
    client: float
    server: float | None

    @property
    def rate(self) -> float:
        return self.events / self.seconds

    def per_1000(self) -> tuple[float, float | None]:
        s = None if self.server is None else self.server / self.events * 1e6
        return self.client / self.events * 1e6, s


class Bench:
    def __init__(self, dsn: str, conn: asyncpg.Connection, entity_type: str, n: int, workers: int) -> None:
        self.dsn, self.conn, self.et, self.n, self.workers = dsn, conn, entity_type, n, workers
        self.meter_pid = conn.get_server_pid()

    async def measured(self, body: Callable[[], Awaitable[int]]) -> Side:
        cpu = CpuMeter(self.meter_pid)
        cpu.start()
        t0 = time.perf_counter()
        events = await body()
        seconds = time.perf_counter() - t0
        cpu.stop()
        return Side(events, seconds, cpu.client, cpu.server)

    async def raw(self, _j: Journal) -> Side:
        async def body() -> int:
            return len(await self.conn.fetch(RAW, self.et))

        return await self.measured(body)

    async def slice_read(self, j: Journal) -> Side:
        async def body() -> int:
            count = 0
            async for _ in j.current_events_by_slices(self.et, 0, 1023):
                count += 1
            return count

        return await self.measured(body)

    async def grouped(self, j: Journal) -> Side:
        await self.conn.execute("TRUNCATE bench_projected")

        async def handler(conn: Any, envs: Sequence[EventEnvelope]) -> None:
            await conn.execute(
                "INSERT INTO bench_projected SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])",
                [e.persistence_id for e in envs],
                [e.seq_nr for e in envs],
                [e.event["v"] for e in envs],
            )

        side = await self._projection(j, handler, "grouped")
        projected = await self.conn.fetchval("SELECT count(*) FROM bench_projected")
        dup = await self.conn.fetchval("SELECT count(*) - count(DISTINCT (pid, seq)) FROM bench_projected")
        assert projected == self.n and dup == 0, f"read model: {projected} rows ({dup} duplicates), expected {self.n}"
        return side

    async def at_least_once(self, j: Journal) -> Side:
        newest: dict[str, int] = {}
        handled = [0]

        async def handler(env: EventEnvelope) -> None:
            newest[env.persistence_id] = env.event["v"]
            handled[0] += 1

        side = await self._projection(j, handler, "at-least-once", handled)
        assert len(newest) * 500 == self.n and handled[0] == self.n, (len(newest), handled[0])
        return side

    async def _projection(self, j: Journal, handler: Any, mode: str, handled: list[int] | None = None) -> Side:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        ws = [Worker(j, j.settings, name, self.et, handler, mode) for _ in range(self.workers)]
        tasks: list[asyncio.Task[None]] = []

        def done() -> int:
            return handled[0] if handled is not None else sum(w.stats.events for w in ws)

        async def body() -> int:
            tasks.extend(asyncio.create_task(w.run()) for w in ws)
            # done when the workers' own counters say so: polling count(*) on the growing read
            # model would itself cost the server a scan each time (checked once after)
            while done() < self.n:
                for task in tasks:
                    if task.done():
                        task.result()
                await asyncio.sleep(0.01)
            return self.n

        side = await self.measured(body)
        for w in ws:
            w.stop()
        await asyncio.gather(*tasks)
        return side


async def load(dsn: str, et: str, n: int) -> int:
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
        t0 = time.perf_counter()
        per_call, done = 500, 0
        while done < n:
            parts = [
                Write(f"{et}|{uuid.uuid4().hex}", [{"v": i} for i in range(per_call)])
                for k in range(min(20, max(1, (n - done) // per_call)))
            ]
            # bounded: a write that never returns is reported instead of hanging the benchmark
            out = await asyncio.wait_for(j.persist_many(parts), 120)
            assert not failures(out), failures(out)[:3]
            done += len(parts) * per_call
        print(f"# wrote {done:,} events at {done / (time.perf_counter() - t0):,.0f} events/s")
        return done


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


async def row(
    title: str, settings: JournalSettings, bench: Bench, ours: Callable[[Journal], Awaitable[Side]],
    rounds: int, goal: float | None,
) -> None:  # fmt: skip
    """Paired rounds of ``ours`` and the slice read (order swapped each round); the median ratio."""
    load0 = os.getloadavg()[0]
    sides: list[tuple[Side, Side]] = []
    async with open_journal(bench.dsn, settings=settings) as j:
        await bench.slice_read(j)  # warm: the pool, the prepared statements, the page cache
        for r in range(rounds):
            if r % 2 == 0:
                a = await ours(j)
                b = await bench.slice_read(j)
            else:
                b = await bench.slice_read(j)
                a = await ours(j)
            assert a.events == b.events == bench.n, (a.events, b.events, bench.n)
            sides.append((a, b))
    ratios = [a.rate / b.rate for a, b in sides]
    ratio = statistics.median(ratios)
    mid = sorted(range(rounds), key=lambda i: ratios[i])[rounds // 2]
    a, b = sides[mid]
    verdict = "" if goal is None else f"  goal {goal:.1f}: {'MET' if ratio >= goal else 'MISSED'}"
    print(f"{title}")
    print(
        f"    {a.rate:>9,.0f} ev/s against the slice read's {b.rate:>9,.0f} (median round); "
        f"ratio {ratio:.2f}{verdict}; rounds {', '.join(f'{x:.2f}' for x in ratios)}; "
        f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    ca, sa = a.per_1000()
    cb, sb = b.per_1000()
    print(f"    CPU ms per 1000 events, client / server: this row {_ms(ca)} / {_ms(sa)}, ", end="")
    print(f"slice read {_ms(cb)} / {_ms(sb)}")


async def main(n: int, rounds: int, workers: int, dsn: str) -> None:
    et = f"Bench{uuid.uuid4().hex[:6]}"
    n = await load(dsn, et, n)
    conn = await asyncpg.connect(dsn)
    try:
        # settle the fresh table (hint bits, visibility map, statistics) before measuring, so
        # neither side pays for, or races with, autovacuum's first pass
        await conn.execute("VACUUM (ANALYZE) event_journal")
        await conn.execute("CREATE UNLOGGED TABLE bench_projected (pid TEXT, seq BIGINT, v BIGINT)")
        bench = Bench(dsn, conn, et, n, workers)
        default = JournalSettings.load(env={}, dsn=dsn)
        tuned = JournalSettings.load(env={}, dsn=dsn, **TUNED)
        tuned_text = ", ".join(f"{k} {v}" for k, v in TUNED.items())
        async with open_journal(dsn, settings=default) as j:
            # untimed: the first projection of a fresh server costs it twice the CPU of the next
            await bench.grouped(j)
        await row("raw asyncpg SELECT of the same rows (the ceiling)", default, bench, bench.raw, rounds, None)
        for title, settings, goal in (("default settings", default, 0.6), (f"tuned: {tuned_text}", tuned, 0.6)):
            await row(f"grouped exactly-once, {workers} workers, {title}", settings, bench, bench.grouped, rounds, goal)
        for title, settings in (("default settings", default), (f"tuned: {tuned_text}", tuned)):
            await row(f"at-least-once, {workers} workers, {title}", settings, bench, bench.at_least_once, rounds, 0.8)
    finally:
        await conn.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds per row (at least 3 for a median)")
    ap.add_argument("--workers", type=int, default=2, help="workers (slice ranges) in this process")
    ap.add_argument("--asyncio", action="store_true", help="asyncio.run, the collector untuned (both sides)")
    a = ap.parse_args()
    loop = "asyncio, collector untuned" if a.asyncio else f"journal.runtime: {runtime.loop_name()}, collector tuned"
    header(f"projection throughput: {a.events:,} events, {a.rounds} paired rounds per row; {loop}")
    with fresh_database() as fresh:
        if a.asyncio:
            asyncio.run(main(a.events, a.rounds, a.workers, fresh))
        else:  # as `projections run` runs its workers
            runtime.run(main(a.events, a.rounds, a.workers, fresh))
