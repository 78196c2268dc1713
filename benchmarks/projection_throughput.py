"""Grouped exactly-once projection of N events into a table, beside the raw slice read rate
(``current_events_by_slices`` over all slices) and a raw asyncpg SELECT, in the same run. Usage:
    [JOURNAL_DSN=postgresql://...] python benchmarks/projection_throughput.py [--events N] [--workers K]
(default 1,000,000 events; a fresh database on JOURNAL_DSN's server, else an embedded server).
Prints events/s and ratios."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from journal import EventEnvelope, JournalSettings, Write, failures, open_journal
from projections import Worker

try:
    from benchmarks._common import CpuMeter, fresh_database
except ImportError:  # run as a script from benchmarks/
    from _common import CpuMeter, fresh_database  # type: ignore[no-redef]


async def handler(conn: Any, envs: Sequence[EventEnvelope]) -> None:
    await conn.execute(
        "INSERT INTO bench_projected SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[])",
        [e.persistence_id for e in envs],
        [e.seq_nr for e in envs],
        [e.event["v"] for e in envs],
    )


async def main(dsn: str, n: int, entities: int, group_size: int, workers: int) -> None:
    et = f"Bench{uuid.uuid4().hex[:6]}"
    s = JournalSettings.load(env={}, dsn=dsn, group_size=group_size, buffer_size=10_000)
    conn = await asyncpg.connect(dsn)
    await conn.execute("CREATE UNLOGGED TABLE IF NOT EXISTS bench_projected (pid TEXT, seq BIGINT, v BIGINT)")
    await conn.execute("TRUNCATE bench_projected")
    async with open_journal(dsn, settings=s) as j:
        t0 = time.perf_counter()
        per_call, done = 500, 0
        while done < n:
            parts = [
                Write(f"{et}|e{(done // per_call + k) % entities}", [{"v": i} for i in range(per_call)])
                for k in range(min(20, max(1, (n - done) // per_call)))
            ]
            # bounded: a write that never returns is reported instead of hanging the benchmark
            out = await asyncio.wait_for(j.persist_many(parts), 120)
            assert not failures(out), failures(out)[:3]
            done += len(parts) * per_call
        n = done
        write_rate = n / (time.perf_counter() - t0)
        print(f"wrote {n} events at {write_rate:,.0f} events/s")
        # settle the fresh table (hint bits, visibility map, statistics) before measuring, so
        # neither the reads nor the projection below pay for, or race with, autovacuum's first pass
        await conn.execute("VACUUM (ANALYZE) event_journal")

        t0 = time.perf_counter()
        count = 0
        async for _ in j.current_events_by_slices(et, 0, 1023):
            count += 1
        read_rate = count / (time.perf_counter() - t0)

        t0 = time.perf_counter()
        rows = await conn.fetch("SELECT * FROM event_journal WHERE entity_type = $1 ORDER BY db_timestamp, seq_nr", et)
        raw_rate = len(rows) / (time.perf_counter() - t0)
        del rows

        ws = [Worker(j, s, f"bench-{et}", et, handler, "grouped") for _ in range(workers)]
        cpu = CpuMeter(conn.get_server_pid())
        cpu.start()
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(w.run()) for w in ws]
        # done when the workers have committed n events (their own counters: polling count(*) on
        # the growing read model would itself cost the server a full scan every time); the
        # read model is checked against n right after
        while sum(w.stats.events for w in ws) < n:
            for task in tasks:
                if task.done():
                    task.result()
            await asyncio.sleep(0.02)
        proj_rate = n / (time.perf_counter() - t0)
        cpu.stop()
        projected = await conn.fetchval("SELECT count(*) FROM bench_projected")
        assert projected == n, f"read model has {projected} rows, expected {n}"
        for w in ws:
            w.stop()
        await asyncio.gather(*tasks)
        dup = await conn.fetchval("SELECT count(*) - count(DISTINCT (pid, seq)) FROM bench_projected")
    await conn.close()
    print(f"load average: {os.getloadavg()}")
    print(f"raw asyncpg SELECT (ceiling):       {raw_rate:12,.0f} events/s")
    print(f"current_events_by_slices (0-1023):  {read_rate:12,.0f} events/s  ({read_rate / raw_rate:.2f} of raw)")
    print(
        f"grouped exactly-once projection, {workers} worker(s): {proj_rate:12,.0f} events/s  "
        f"({proj_rate / read_rate:.2f} of the slice read rate, {proj_rate / raw_rate:.2f} of raw; duplicates {dup})"
    )
    print(f"    projection {cpu.per_1000(n)} (load-independent; the machine has {os.cpu_count()} cores)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--entities", type=int, default=10_000)
    ap.add_argument("--group-size", type=int, default=5000)
    ap.add_argument("--workers", type=int, default=2, help="workers (slice ranges) in this process")
    a = ap.parse_args()
    with fresh_database() as dsn:
        asyncio.run(main(dsn, a.events, a.entities, a.group_size, a.workers))
