"""A lone call layer by layer, call by call in turn (one pid per layer): wall, client CPU and the
server backend's CPU (/proc/PID/schedstat) per call, medians.

    PYTHONPATH=. python benchmarks/profiles/lone_layers.py 2000
"""

import os
import statistics
import sys
import time
import uuid

import asyncpg
import orjson

from benchmarks._common import fresh_database
from benchmarks.write_breakdown import _cpu_ns
from benchmarks.write_throughput import RAW_SINGLE, payload
from journal import JournalSettings, open_journal, runtime, slice_for


async def main(dsn, n):
    conn = await asyncpg.connect(dsn, server_settings={"slice_journal.writer": "rule"})
    raw = await conn.prepare(RAW_SINGLE)
    w = str(uuid.uuid4())
    mine = f"/proc/{conn.get_server_pid()}/schedstat"
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
        v, be = j._validator, j.backend
        sql = be.statements
        await j.persist("warm|1", [1])
        wc = await be.take_writer()
        be.release_writer(wc)
        theirs = f"/proc/{wc.get_server_pid()}/schedstat"  # the journal's one write connection (idle journal)
        lone = await conn.prepare(sql.statement(v.call("x|1", [1], 0), w, 0)[0])

        async def f_raw(i):
            await raw.fetch(slice_for("raw|1"), "raw|1", i + 1, orjson.dumps(payload(i)), w)

        async def f_prep(i):
            await lone.fetchrow(*sql.statement(v.call("prep|1", [payload(i)], i), w, 0)[1])

        async def f_text(i):
            text, params = sql.statement(v.call("text|1", [payload(i)], i), w, 0)
            await conn.fetchrow(text, *params)

        async def f_backend(i):
            await be.write_batch(v.call("be|1", [payload(i)], i))

        async def f_persist(i):
            await j.persist("one|1", [payload(i)], expected_seq_nr=i)

        sides = {
            "raw prepared INSERT": (f_raw, mine),
            "lone, prepared": (f_prep, mine),
            "lone, fetchrow by text": (f_text, mine),
            "backend.write_batch": (f_backend, theirs),
            "journal.persist": (f_persist, theirs),
        }
        names = list(sides)
        wall, cpu, srv = ({k: [] for k in sides} for _ in range(3))
        for i in range(n):
            for k in range(len(names)):
                name = names[(i + k) % len(names)]  # the order rotated every call
                f, sched = sides[name]
                s0, c0, t0 = _cpu_ns(sched), time.process_time(), time.perf_counter()
                await f(i)
                t1, c1 = time.perf_counter(), time.process_time()
                srv[name].append((_cpu_ns(sched) - s0) / 1e9)
                wall[name].append(t1 - t0)
                cpu[name].append(c1 - c0)
    print(f"load {os.getloadavg()[0]:.2f}")

    def m(xs):
        return 1e6 * statistics.median(xs[200:])

    for k in names:
        print(f"{k:<26} wall {m(wall[k]):6.1f}  client CPU {m(cpu[k]):6.1f}  server CPU {m(srv[k]):6.1f} µs")


with fresh_database() as dsn:
    runtime.run(main(dsn, int(sys.argv[1])))
