"""The journal over several databases: the routing's cost, and a move's throughput and write pause.

(a) The same rows written (many entities, pids spread evenly over the slices like UUIDs, one
    event per call, expected_seq_nr known) and then caught up (``current_events_by_slices``
    over 4 slice ranges at once) by a plain journal on one database and by a partitioned
    journal over 1, 2 and 4 databases on the same server, in alternating rounds (best of
    each). The figure is each layout's rows/s over the plain journal's, measured in the same
    run: the routing's overhead (goal >= 0.95).
(b) A move of slices 512-767 to a fifth database while writers keep writing at a steady rate
    (``--rate``) over every slice: the move's copy throughput (rows/s while writes went on),
    the fence (writes of the range wait from the fence to the switch), and the latency of the
    writes of the moved range during the move (p50, p99, max: the write pause) beside that of
    the other slices' writes in the same window. Then every event is counted once.

    python benchmarks/partitions.py [--events 100000] [--entities 500] [--rounds 3]
        [--move-events 200000] [--rate 2000]

The server is ``JOURNAL_DSN`` when set, else an embedded PostgreSQL in a temporary directory;
its databases are made fresh and dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import asyncpg

from journal import JournalSettings, SequenceConflict, Write, failures, open_journal, runtime, slice_for, slice_ranges
from journal.backends import open_partitioned
from journal.partitioned.move import SliceMove
from journal.postgres import asyncpg_dsn
from journal.postgres.migrations import upgrade
from tests.support.scratch import scratch_database

try:
    from benchmarks._common import header
except ImportError:  # run as a script from benchmarks/
    from _common import header  # type: ignore[no-redef]

LAYOUTS = ("plain", 1, 2, 4)
MOVED = (512, 767)


@contextlib.contextmanager
def databases(n: int) -> Iterator[list[str]]:
    """``n`` fresh migrated databases on one server."""
    with contextlib.ExitStack() as stack:
        server = os.environ.get("JOURNAL_DSN")
        if not server:
            from journal.postgres import start_embedded

            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="sj-bench-"))
            server = start_embedded(Path(tmp) / "pgdata")
        dsns = [stack.enter_context(scratch_database(server, "sjbench")) for _ in range(n)]
        for d in dsns:
            upgrade(d)
        yield dsns


def settings_for(layout: object, dsns: Sequence[str]) -> JournalSettings:
    """Each layout on databases of its own (a database keeps the range it first claimed)."""
    if layout == "plain":
        return JournalSettings.load(env={}, dsn=dsns[0])
    assert isinstance(layout, int)
    return JournalSettings.load(env={}, databases=list(dsns[layout : 2 * layout]))  # 1: [1], 2: [2, 3], 4: [4..7]


def entity_pid(entity_type: str, e: int) -> str:
    """A pid whose slice is spread evenly, like a UUID's. Numbered pids (``cart|1``, ``cart|2``)
    share a Java hashCode prefix, so their slices cluster: 500 of them put 17 and 483 pids on two
    databases, or none on one of four, and the figure measured that skew, not the routing."""
    return f"{entity_type}|{uuid.uuid5(uuid.NAMESPACE_OID, str(e))}"


def payload(i: int) -> dict[str, object]:
    return {"item": f"sku-{i % 977}", "qty": i % 7 + 1, "price": 1999}


async def write_and_catch_up(
    layout: object, dsns: Sequence[str], entity_type: str, entities: int, per_entity: int
) -> tuple[float, float]:
    """Rows/s of the writes, and of the catch-up read of the same rows."""
    async with open_journal(settings=settings_for(layout, dsns)) as j:

        async def entity(e: int) -> None:
            pid = entity_pid(entity_type, e)
            for n in range(per_entity):
                await j.persist(pid, [payload(n)], expected_seq_nr=n)

        start = time.perf_counter()
        await asyncio.gather(*(entity(e) for e in range(entities)))
        wrote = time.perf_counter() - start

        async def catch_up(lo: int, hi: int) -> int:
            n = 0
            async for _ in j.current_events_by_slices(entity_type, lo, hi):
                n += 1
            return n

        start = time.perf_counter()
        got = sum(await asyncio.gather(*(catch_up(lo, hi) for lo, hi in slice_ranges(4))))
        read = time.perf_counter() - start
    rows = entities * per_entity
    assert got == rows, f"{layout}: caught up {got} of {rows} rows"
    return rows / wrote, rows / read


async def routing(dsns: Sequence[str], args: argparse.Namespace) -> None:
    per_entity = max(1, args.events // args.entities)
    rows = args.entities * per_entity
    best: dict[object, tuple[float, float, float]] = {}
    for layout in LAYOUTS:  # warm-up: pools, plans, the partition maps claimed
        await write_and_catch_up(layout, dsns, f"warm{layout}", 50, 5)
    for k in range(args.rounds):
        order = LAYOUTS if k % 2 == 0 else tuple(reversed(LAYOUTS))
        for layout in order:
            w, r = await write_and_catch_up(layout, dsns, f"r{k}n{layout}", args.entities, per_entity)
            both = 1 / (1 / w + 1 / r)  # rows/s of writing them and then catching them up
            if layout not in best or both > best[layout][2]:
                best[layout] = (w, r, both)
    base = best["plain"]
    print(f"(a) {rows} rows ({args.entities} entities x {per_entity}, one per call), best of {args.rounds} rounds")
    for layout in LAYOUTS:
        w, r, both = best[layout]
        name = "plain journal, one database" if layout == "plain" else f"partitioned, {layout} database(s)"
        print(
            f"    {name:<30} write {w:>9,.0f} rows/s ({w / base[0]:.2f})   catch-up {r:>9,.0f} rows/s"
            f" ({r / base[1]:.2f})   both {both:>9,.0f} rows/s   ratio {both / base[2]:.2f}"
            + ("" if layout == "plain" else ("  OK" if both / base[2] >= 0.95 else "  BELOW goal 0.95"))
        )


def pct(xs: Sequence[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


async def move_under_load(dsns: Sequence[str], args: argparse.Namespace) -> None:
    journal_dbs, target = list(dsns[8:10]), dsns[10]
    settings = JournalSettings.load(env={}, databases=journal_dbs)
    entities = 200
    async with open_journal(settings=settings) as j:
        per = max(1, args.move_events // entities)
        for n in range(0, per, 50):  # the rows the move copies
            out = await j.persist_many(
                [Write(f"m|{e}", [payload(n + i) for i in range(min(50, per - n))], n) for e in range(entities)]
            )
            assert not failures(out), failures(out)[:3]
        in_range = sum(per for e in range(entities) if MOVED[0] <= slice_for(f"m|{e}") <= MOVED[1])
        lat: list[tuple[float, float, bool]] = []  # (start, seconds, in the moved range)
        stop = asyncio.Event()
        conflicts: list[tuple[str, int, int]] = []
        writers = 50
        interval = writers / args.rate

        async def writer(w: int) -> None:
            pid, n = f"live|{w}", 0
            moved = MOVED[0] <= slice_for(pid) <= MOVED[1]
            next_at = time.perf_counter()
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    await j.persist(pid, [payload(n)], expected_seq_nr=n)
                except SequenceConflict:  # must not happen: counted, and the writer goes on
                    conflicts.append((pid, n, await j.highest_seq_nr(pid)))
                    n = conflicts[-1][2]
                    continue
                lat.append((t0, time.perf_counter() - t0, moved))
                n += 1
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

        tasks = [asyncio.create_task(writer(w)) for w in range(writers)]
        await asyncio.sleep(2.0)  # the writes' latency before the move
        mover = await open_partitioned(journal_dbs[0], settings)
        try:
            m0 = time.perf_counter()
            report = await SliceMove(mover, *MOVED, target).run()
            m1 = time.perf_counter()
        finally:
            await mover.close()
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.gather(*tasks)
        total = sum(1 for _ in lat)
        live_moved = sum(1 for w in range(writers) if MOVED[0] <= slice_for(f"live|{w}") <= MOVED[1])
        counted = 0
        async for _ in j.current_events_by_slices("live", 0, 1023):
            counted += 1
        pre = [s for t, s, _ in lat if t < m0]
        during_in = [s for t, s, mv in lat if m0 <= t <= m1 and mv]
        during_out = [s for t, s, mv in lat if m0 <= t <= m1 and not mv]
    conn = await asyncpg.connect(asyncpg_dsn(target))
    try:
        on_target = await conn.fetchval(
            "SELECT count(*) FROM event_journal WHERE persistence_id LIKE 'm|%' AND slice BETWEEN $1 AND $2", *MOVED
        )
    finally:
        await conn.close()
    ms = 1000.0
    print(
        f"(b) move of slices {MOVED[0]}-{MOVED[1]} ({in_range} of {entities * per} prefilled rows,"
        f" {report.rows} rows copied in all) to another database on the server while {writers} writers"
        f" wrote {args.rate:,.0f} ev/s over every slice ({live_moved} of them in the range)"
    )
    print(
        f"    copy {report.rows / report.copy_seconds:,.0f} rows/s ({report.passes} passes,"
        f" {report.copy_seconds:.2f} s); whole move {m1 - m0:.2f} s; fence to switch {report.fence_seconds * ms:.0f} ms"
    )
    print(
        f"    write latency before the move: p50 {statistics.median(pre) * ms:.1f} ms,"
        f" p99 {pct(pre, 0.99) * ms:.1f} ms; during it, moved range:"
        f" p50 {statistics.median(during_in) * ms:.1f} ms, p99"
        f" {pct(during_in, 0.99) * ms:.1f} ms, max {max(during_in) * ms:.0f} ms ({len(during_in)} writes);"
        f" other slices: p99 {pct(during_out, 0.99) * ms:.1f} ms, max {max(during_out) * ms:.0f} ms"
    )
    ok = counted == total and on_target == in_range and not conflicts
    print(
        f"    live events written {total}, caught up {counted}; prefilled rows of the range on the target"
        f" {on_target} of {in_range}: {'OK' if ok else 'MISMATCH'}"
        + (f"; {len(conflicts)} writes refused as conflicts (expected_seq_nr was the stored highest)" * bool(conflicts))
    )


async def run(dsns: Sequence[str], args: argparse.Namespace) -> None:
    header("partitions: routing over 1, 2, 4 databases on one server; a move under write load")
    await routing(dsns, args)
    await move_under_load(dsns, args)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--entities", type=int, default=500)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--move-events", type=int, default=200_000)
    p.add_argument("--rate", type=float, default=2000.0)
    args = p.parse_args()
    with databases(11) as dsns:  # plain: 0; 1 database: 1; 2: 2-3; 4: 4-7; the move: 8-9 and 10
        runtime.run(run(dsns, args))
