"""cProfile of one grouped exactly-once round (or at-least-once with ``--mode at-least-once``) of
benchmarks/projection_throughput.py: the same rows, handler and workers, after one untimed round.

    PYTHONPATH=. flock /tmp/sj-bench.lock .venv/bin/python benchmarks/profiles/prof_projection.py [--events N]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import uuid

import asyncpg

from benchmarks._common import fresh_database
from benchmarks.projection_throughput import Bench, load
from journal import JournalSettings, open_journal


async def main(n: int, mode: str, dsn: str, top: int) -> None:
    et = f"Bench{uuid.uuid4().hex[:6]}"
    n = await load(dsn, et, n)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("VACUUM (ANALYZE) event_journal")
        await conn.execute("CREATE UNLOGGED TABLE bench_projected (pid TEXT, seq BIGINT, v BIGINT)")
        bench = Bench(dsn, conn, et, n, 2)
        async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
            side = bench.grouped if mode == "grouped" else bench.at_least_once
            await side(j)  # untimed
            prof = cProfile.Profile()
            prof.enable()
            got = await side(j)
            prof.disable()
        print(f"# {mode}: {got.rate:,.0f} ev/s under the profiler, client CPU {got.client:.2f} s")
        pstats.Stats(prof).sort_stats("tottime").print_stats(top)
    finally:
        await conn.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--mode", choices=["grouped", "at-least-once"], default="grouped")
    ap.add_argument("--top", type=int, default=35)
    a = ap.parse_args()
    with fresh_database() as fresh:
        asyncio.run(main(a.events, a.mode, fresh, a.top))
