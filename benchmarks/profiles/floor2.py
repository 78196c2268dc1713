"""Client CPU of bulk I/O patterns, prebuilt parameters, 1000 one-event rows; variants in turn."""

import asyncio
import statistics
import time
import uuid

import asyncpg

from benchmarks._common import fresh_database
from benchmarks.write_throughput import payload
from journal import Write, runtime
from journal.postgres.statements import Statements
from journal.postgres.write_statements import WriteStatements
from journal.serialization import SerializerRegistry
from journal.write_validation import WriteValidator


async def pattern(conns, stmts, tx):
    if tx:
        for c in conns:
            await c.execute("BEGIN; SET LOCAL lock_timeout = 1000")
    tasks = []
    for k, (text, params) in enumerate(stmts):
        conn = conns[k % len(conns)]
        if k >= len(conns):
            await tasks[k - len(conns)]
        tasks.append(asyncio.ensure_future(conn.fetchrow(text, *params)))
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    if tx:
        for c in conns:
            await c.execute("COMMIT")


async def main(dsn, R=80):
    c1, c2 = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    w = str(uuid.uuid4())
    sql = WriteStatements(Statements("public"), notify=True, bucket_millis=1)
    v = WriteValidator(SerializerRegistry())
    variants = {  # name: (conns, chunk size, transaction)
        "2 conns, 4x250, tx (today)": ((c1, c2), 250, True),
        "2 conns, 4x250, no tx": ((c1, c2), 250, False),
        "1 conn, 4x250, tx": ((c1,), 250, True),
        "1 conn, 2x500, tx": ((c1,), 500, True),
        "1 conn, 1x1000, tx": ((c1,), 1000, True),
        "1 conn, 1x1000, no tx": ((c1,), 1000, False),
        "2 conns, 2x500, tx": ((c1, c2), 500, True),
    }
    times = {k: [] for k in variants}
    for n in range(R):
        for k, (name, (conns, size, tx)) in enumerate(variants.items()):
            batches = list(v.chunks([Write(f"f{k}|{e}", [payload(n)], n) for e in range(1000)], size))
            stmts = [sql.statement(b, w, 0) for b in batches]
            t = time.process_time()
            await pattern(conns, stmts, tx)
            times[name].append(time.process_time() - t)
    for name, ts in times.items():
        print(f"{name:<30} {1e3 * statistics.median(ts[10:]):.2f} ms per 1000 rows")


with fresh_database() as dsn:
    runtime.run(main(dsn))
