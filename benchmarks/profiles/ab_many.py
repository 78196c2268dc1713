"""persist_many of 1000 one-event parts, the caller building them as `Write` values or as plain
tuples of the same fields (both documented forms; a `Write` costs its caller a NamedTuple
`__new__` in Python, about 0.3 ms per 1000), against raw code building, serializing and
inserting the same rows; call by call in turn (order rotated), client CPU (process_time) and wall
per call, medians."""

import contextlib
import statistics
import sys
import time
import uuid

import asyncpg
import orjson

from benchmarks._common import fresh_database
from benchmarks.write_throughput import RAW_INSERT, payload
from journal import JournalSettings, Write, failures, open_journal, runtime, slice_for


async def main(dsn, R):
    conn = await asyncpg.connect(dsn)
    w = str(uuid.uuid4())
    stack = contextlib.AsyncExitStack()
    whole = await stack.enter_async_context(open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)))

    async def raw(n):
        names = [f"raw|{e}" for e in range(1000)]
        await conn.execute(
            RAW_INSERT,
            [slice_for(p) for p in names],
            names,
            [n + 1] * 1000,
            [orjson.dumps(payload(n)) for _ in names],
            w,
        )

    async def of_writes(n):
        out = await whole.persist_many([Write(f"w|{e}", [payload(n)], n) for e in range(1000)])
        assert not failures(out)

    async def of_tuples(n):
        out = await whole.persist_many([(f"t|{e}", [payload(n)], n) for e in range(1000)])
        assert not failures(out)

    sides = {
        "raw from values": raw,
        "persist_many of Write parts": of_writes,
        "persist_many of tuples": of_tuples,
    }
    names = list(sides)
    cpu = {k: [] for k in sides}
    wall = {k: [] for k in sides}
    for n in range(R):
        for k in range(3):
            name = names[(n + k) % 3]
            c, t = time.process_time(), time.perf_counter()
            await sides[name](n)
            wall[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    await stack.aclose()
    await conn.close()
    r_cpu, r_wall = statistics.median(cpu[names[0]][5:]), statistics.median(wall[names[0]][5:])
    for name in names:
        c, t = statistics.median(cpu[name][5:]), statistics.median(wall[name][5:])
        print(
            f"{name:<30} client CPU {1e3 * c:5.2f} ms ({c / r_cpu:.2f} x raw)   wall {1e3 * t:6.2f} ms (raw/this {r_wall / t:.2f})"
        )


with fresh_database() as dsn:
    runtime.run(main(dsn, int(sys.argv[1]) if len(sys.argv) > 1 else 100))
