"""Wait-for-write latency (issue 36): a writer persists one event, then waits until a projection
worker process has processed it (:class:`projections.write_waits.WriteWaits`), one write at a
time at ``--rate`` writes/s, with the projection caught up.

Two figures per write, and the ceiling in the same run (a bare insert + ``pg_notify`` committed,
received by a bare asyncpg LISTEN, timed the same way):
- **offset commit -> wait returns**: the wait's own latency, from the offset row's
  ``timestamp_consumed`` (the database clock when the worker's offset transaction inserted it,
  just before its COMMIT, so an upper bound) to the wall clock when ``wait`` returned (same host);
- **persist returned -> wait returns**: what a service sees, the projection's own delivery (the
  live query, ``group_max_wait``) included.

    python benchmarks/write_wait_latency.py [--writes 500] [--rate 50] [--group-max-wait 0.005]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime

import asyncpg

from journal import JournalSettings, open_journal
from projections.demo.cart import prepare
from projections.write_waits import WriteWaits

try:
    from benchmarks._common import fresh_database, header
except ImportError:  # run as a script from benchmarks/
    from _common import fresh_database, header  # type: ignore[no-redef]

NAME, ET = "bench-wait", "WaitBench"
ITEM = {"type": "ItemAdded", "item": "sku-1", "qty": 1}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def line(name: str, xs: list[float]) -> None:
    print(
        f"{name:<40} n={len(xs):>6}  p50 {statistics.median(xs) * 1000:8.2f} ms"
        f"  p99 {pct(xs, 99) * 1000:8.2f} ms  max {max(xs) * 1000:8.2f} ms"
    )


async def measure(dsn: str, writes: int, rate: float) -> tuple[list[float], list[float]]:
    settings = JournalSettings.load(env={}, dsn=dsn)
    after_commit: list[float] = []
    end_to_end: list[float] = []
    async with open_journal(dsn, settings=settings) as j, WriteWaits.open(j) as waits:
        conn = await asyncpg.connect(dsn)
        envs = await j.persist(f"{ET}|warm-up", [ITEM])
        deadline = time.monotonic() + 120
        while not await conn.fetchval("SELECT count(*) FROM demo_cart_projected"):  # the worker is up
            if time.monotonic() > deadline:
                raise SystemExit("the worker did not process the first event within 120 s")
            await asyncio.sleep(0.1)
        for i in range(writes):
            started = time.perf_counter()
            envs = await j.persist(f"{ET}|{i % 100}", [ITEM])
            persisted = time.perf_counter()
            if not await waits.wait(NAME, envs, timeout=30):
                raise SystemExit(f"write {i} not processed within 30 s")
            returned, wall = time.perf_counter(), time.time()
            consumed: datetime = await conn.fetchval(
                "SELECT max(timestamp_consumed) FROM projection_timestamp_offset_store"
                " WHERE projection_name = $1 AND persistence_id = $2 AND seq_nr = $3",
                NAME, envs[0].persistence_id, envs[0].seq_nr,
            )  # fmt: skip
            after_commit.append(max(0.0, wall - consumed.timestamp()))
            end_to_end.append(returned - persisted)
            await asyncio.sleep(max(0.0, 1 / rate - (time.perf_counter() - started)))
        await conn.close()
    return after_commit, end_to_end


async def raw_notify(dsn: str, writes: int, rate: float) -> list[float]:
    """The ceiling, same run and metric: a transaction inserting a row (its ``clock_timestamp()``)
    and notifying, committed; time until a bare asyncpg LISTEN has the notification."""
    listener, sender = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    await sender.execute("CREATE TABLE IF NOT EXISTS raw_wait (n int, at timestamptz)")
    got: asyncio.Queue[float] = asyncio.Queue()
    await listener.add_listener("raw_wait", lambda *_: got.put_nowait(time.time()))
    out: list[float] = []
    for i in range(writes):
        started = time.perf_counter()
        async with sender.transaction():
            at: datetime = await sender.fetchval(
                "WITH i AS (INSERT INTO raw_wait VALUES ($1, clock_timestamp()) RETURNING at)"
                " SELECT (SELECT at FROM i) FROM pg_notify('raw_wait', $1::text)", i,
            )  # fmt: skip
        out.append(max(0.0, await got.get() - at.timestamp()))
        await asyncio.sleep(max(0.0, 1 / rate - (time.perf_counter() - started)))
    await listener.close()
    await sender.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--writes", type=int, default=500)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--group-max-wait", type=float, default=0.005, help="the worker's projection.group_max_wait")
    args = ap.parse_args()
    header(f"wait for a write: {args.writes} writes at {args.rate:.0f}/s, group_max_wait {args.group_max_wait}s")
    with fresh_database() as dsn:
        setup = asyncpg.connect(dsn)

        async def prepared() -> None:
            c = await setup
            await prepare(c)
            await c.close()

        asyncio.run(prepared())
        env = {**os.environ, "JOURNAL_PROJECTION_GROUP_MAX_WAIT": str(args.group_max_wait)}
        worker = subprocess.Popen(
            [sys.executable, "-m", "projections", "run", NAME, "--entity-type", ET, "--handler",
             "projections.demo.cart:project_carts", "--dsn", dsn, "--no-progress"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            after_commit, end_to_end = asyncio.run(measure(dsn, args.writes, args.rate))
        finally:
            worker.terminate()
            worker.wait(30)
        raw = asyncio.run(raw_notify(dsn, args.writes, args.rate))
    line("raw: insert+notify commit -> LISTEN", raw)
    line("offset commit -> wait returns", after_commit)
    line("persist returned -> wait returns", end_to_end)
    p99 = pct(after_commit, 99)
    print(f"# wait p99 {p99 * 1000:.2f} ms after the offset commit: {'OK' if p99 <= 0.005 else 'ABOVE'} target 5 ms")


if __name__ == "__main__":
    main()
