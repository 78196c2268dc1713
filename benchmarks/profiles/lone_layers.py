"""A lone call's client CPU layer by layer, call by call in turn (one pid per layer)."""

import statistics
import sys
import time
import uuid

import asyncpg
import orjson

from benchmarks._common import fresh_database
from benchmarks.write_throughput import RAW_SINGLE, payload
from journal import JournalSettings, open_journal, runtime, slice_for


async def main(dsn, n):
    conn = await asyncpg.connect(dsn)
    raw = await conn.prepare(RAW_SINGLE)
    w = str(uuid.uuid4())
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
        v, be = j._validator, j.backend
        sql = be.statements if hasattr(be, "statements") else be.writes.statements
        lone = None

        async def f_raw(i):
            await raw.fetch(slice_for("raw|1"), "raw|1", i + 1, orjson.dumps(payload(i)), w)

        async def f_text(i):
            b = v.call("text|1", [payload(i)], i)
            text, params = sql.statement(b, w, 0)
            await conn.fetchrow(text, *params)

        async def f_backend(i):
            await be.write_batch(v.call("be|1", [payload(i)], i))

        async def f_persist(i):
            await j.persist("one|1", [payload(i)], expected_seq_nr=i)

        sides = {
            "raw prepared INSERT": f_raw,
            "lone statement, fetchrow": f_text,
            "backend.write_batch": f_backend,
            "journal.persist": f_persist,
        }
        cpu = {k: [] for k in sides}
        for i in range(n):
            for name, f in sides.items():
                c = time.process_time()
                await f(i)
                cpu[name].append(time.process_time() - c)
    for k, ts in cpu.items():
        print(f"{k:<28} client CPU {1e6 * statistics.median(ts[200:]):6.1f} µs per call")


with fresh_database() as dsn:
    runtime.run(main(dsn, int(sys.argv[1])))
