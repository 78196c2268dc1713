"""Commit -> delivery latency of events_by_slices under a steady write load.

A writer persists one event per call at ``--rate`` calls/s for ``--seconds``; a second journal
runs 4 live ``events_by_slices`` queries (the 4 slice ranges). Latency = delivery time minus the
time ``persist`` returned (the commit). Measured with NOTIFY (the default) and with polling alone
(writer ``notify=False``, reader ``--poll-refresh``). The raw figure is a bare asyncpg LISTEN:
time from a committed ``pg_notify`` to its receipt, in the same run.

    python benchmarks/live_latency.py [--rate 200] [--seconds 10] [--poll-refresh 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg

from journal import JournalSettings, open_journal, slice_ranges

try:
    from benchmarks._common import fresh_database, header
except ImportError:  # run as a script from benchmarks/
    from _common import fresh_database, header  # type: ignore[no-redef]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


async def measure(dsn: str, rate: float, seconds: float, notify: bool, refresh: float) -> list[float]:
    wset = JournalSettings.load(env={}, dsn=dsn, notify=notify)
    rset = JournalSettings.load(env={}, dsn=dsn, refresh_interval=refresh)
    committed: dict[tuple[str, int], float] = {}
    delivered: dict[tuple[str, int], float] = {}
    async with open_journal(dsn, settings=wset) as w, open_journal(dsn, settings=rset) as r:

        async def consume(lo: int, hi: int) -> None:
            async for e in r.events_by_slices("lat", lo, hi):
                delivered[(e.persistence_id, e.seq_nr)] = time.perf_counter()

        tasks = [asyncio.create_task(consume(lo, hi)) for lo, hi in slice_ranges(4)]
        await asyncio.sleep(0.5)
        interval = 1.0 / rate
        start = time.perf_counter()
        i = 0
        inflight: set[asyncio.Task[None]] = set()

        async def one(n: int) -> None:
            envs = await w.persist(f"lat|{n % 500}", [{"n": n}])
            committed[(envs[0].persistence_id, envs[0].seq_nr)] = time.perf_counter()

        while time.perf_counter() - start < seconds:
            t = asyncio.create_task(one(i))
            inflight.add(t)
            t.add_done_callback(inflight.discard)
            i += 1
            await asyncio.sleep(max(0.0, start + i * interval - time.perf_counter()))
        await asyncio.gather(*inflight)
        deadline = time.perf_counter() + refresh + 5
        while not committed.keys() <= delivered.keys() and time.perf_counter() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    missing = len(committed) - len(committed.keys() & delivered.keys())
    if missing:
        print(f"# WARNING: {missing} events not delivered in time")
    # delivery can beat the writer's own wake-up after commit: clamp at 0
    return [max(0.0, delivered[k] - t) for k, t in committed.items() if k in delivered]


async def raw_listen(dsn: str, rate: float, seconds: float) -> list[float]:
    listener = await asyncpg.connect(dsn)
    sender = await asyncpg.connect(dsn)
    got: dict[str, float] = {}
    listener_cb = lambda *a: got.__setitem__(a[3], time.perf_counter())  # noqa: E731
    await listener.add_listener("raw_latency", listener_cb)
    sent: dict[str, float] = {}
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < seconds:
        await sender.execute("SELECT pg_notify('raw_latency', $1)", str(i))
        sent[str(i)] = time.perf_counter()
        i += 1
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
    await asyncio.sleep(0.5)
    await listener.close()
    await sender.close()
    return [max(0.0, got[k] - t) for k, t in sent.items() if k in got]


def line(name: str, xs: list[float]) -> None:
    print(
        f"{name:<40} n={len(xs):>6}  p50 {statistics.median(xs) * 1000:8.1f} ms"
        f"  p99 {pct(xs, 99) * 1000:8.1f} ms  max {max(xs) * 1000:8.1f} ms"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--poll-refresh", type=float, default=0.5)
    args = ap.parse_args()
    header(f"live latency: commit -> delivery, {args.rate:.0f} writes/s for {args.seconds:.0f}s, 4 ranges")
    with fresh_database() as dsn:
        raw = asyncio.run(raw_listen(dsn, args.rate, args.seconds))
        with_notify = asyncio.run(measure(dsn, args.rate, args.seconds, True, 3.0))
        polling = asyncio.run(measure(dsn, args.rate, args.seconds, False, args.poll_refresh))
    line("raw asyncpg LISTEN (ceiling)", raw)
    line("events_by_slices with NOTIFY", with_notify)
    line(f"events_by_slices polling only ({args.poll_refresh}s)", polling)
    p99 = pct(with_notify, 99)
    print(
        f"# NOTIFY p99 {p99 * 1000:.1f} ms: {'OK' if p99 <= 0.05 else 'ABOVE'} target 50 ms;"
        f" p50 ratio raw/journal {statistics.median(raw) / max(statistics.median(with_notify), 1e-9):.2f}"
    )


if __name__ == "__main__":
    main()
