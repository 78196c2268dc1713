"""Client CPU of a persist_many call's I/O alone (issue 37 item 3): the journal's batch
statements with parameters built beforehand, one statement of 1000 one-event rows or 2 x 500 at
once on two connections, against a whole persist_many call of the same parts and raw code's
INSERT of rows built beforehand; variants in turn, process_time medians."""

import asyncio
import statistics
import sys
import time
import uuid

import asyncpg
import orjson

from benchmarks._common import fresh_database
from benchmarks.write_throughput import RAW_INSERT, payload
from journal import JournalSettings, Write, open_journal, runtime, slice_for
from journal.postgres.statements import Statements
from journal.postgres.write_statements import WriteStatements
from journal.serialization import SerializerRegistry
from journal.write_validation import WriteValidator


async def main(dsn, R):
    c1, c2 = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    w = str(uuid.uuid4())
    sql = WriteStatements(Statements("public"), notify=True, bucket_millis=1)
    v = WriteValidator(SerializerRegistry())
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:

        async def stmts(conns, size, n, k):
            parts = [Write(f"f{k}|{e}", [payload(n)], n) for e in range(1000)]
            built = [sql.statement(b, w, 0) for b in v.chunks(parts, size)]
            t = time.process_time()
            await asyncio.gather(*[conns[i % len(conns)].fetchrow(s, *p) for i, (s, p) in enumerate(built)])
            return time.process_time() - t

        async def raw(n, k):
            names = [f"raw{k}|{e}" for e in range(1000)]
            args = ([slice_for(p) for p in names], names, [n + 1] * 1000, [orjson.dumps(payload(n)) for _ in names], w)
            t = time.process_time()
            await c1.execute(RAW_INSERT, *args)
            return time.process_time() - t

        async def many(n, k):
            parts = [Write(f"m{k}|{e}", [payload(n)], n) for e in range(1000)]
            t = time.process_time()
            await j.persist_many(parts)
            return time.process_time() - t

        variants = {
            "statement 1 x 1000, 1 conn": lambda n, k: stmts((c1,), 1000, n, k),
            "statements 2 x 500, 2 conns": lambda n, k: stmts((c1, c2), 500, n, k),
            "raw INSERT, rows built": raw,
            "persist_many, whole call": many,
        }
        times = {k: [] for k in variants}
        for n in range(R):
            for k, name in enumerate(variants):
                times[name].append(await variants[name](n, k))
    for name, ts in times.items():
        print(f"{name:<30} {1e3 * statistics.median(ts[5:]):.2f} ms client CPU per 1000 rows")
    await c1.close()
    await c2.close()


with fresh_database() as dsn:
    runtime.run(main(dsn, int(sys.argv[1]) if len(sys.argv) > 1 else 80))
