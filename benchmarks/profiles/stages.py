"""persist_many's client CPU per stage, 1000 one-event parts, against raw code building the same rows."""

import statistics
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
from journal.write_validation import WriteValidator, _plain_calls

N, R = 1000, 60


def cpu(f):
    t = time.process_time()
    r = f()
    return r, time.process_time() - t


async def acpu(coro):
    t = time.process_time()
    r = await coro
    return r, time.process_time() - t


async def main(dsn):
    conn = await asyncpg.connect(dsn)
    w = str(uuid.uuid4())
    reg = SerializerRegistry()
    v = WriteValidator(reg)
    sql = WriteStatements(Statements("public"), notify=True, bucket_millis=1)
    st = {
        k: []
        for k in [
            "parts",
            "plain_calls",
            "serialize",
            "chunk total",
            "statement params",
            "execute (journal stmt)",
            "raw: rows + orjson",
            "raw: execute",
            "persist_many whole",
        ]
    }
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
        for n in range(R):
            parts, t = cpu(lambda: [Write(f"s|{e}", [payload(n)], n) for e in range(N)])
            st["parts"].append(t)
            plain, t = cpu(lambda: _plain_calls(parts))
            st["plain_calls"].append(t)
            _, t = cpu(lambda: reg.serialize_events(plain[2], plain[0]))
            st["serialize"].append(t)
            batch, t = cpu(lambda: next(v.chunks(parts, N)))
            st["chunk total"].append(t)
            (text, params), t = cpu(lambda: sql.statement(batch, w, 0))
            st["statement params"].append(t)
            _, t = await acpu(conn.fetchrow(text, *params))
            st["execute (journal stmt)"].append(t)

            def raw_rows():
                names = [f"r|{e}" for e in range(N)]
                return ([slice_for(p) for p in names], names, [n + 1] * N, [orjson.dumps(payload(n)) for _ in names])

            rows, t = cpu(raw_rows)
            st["raw: rows + orjson"].append(t)
            _, t = await acpu(conn.execute(RAW_INSERT, *rows, w))
            st["raw: execute"].append(t)
            parts2 = [Write(f"m|{e}", [payload(n)], n) for e in range(N)]
            _, t = await acpu(j.persist_many(parts2))
            st["persist_many whole"].append(t)
    for k, ts in st.items():
        ts = ts[10:]
        print(f"{k:<26} {1e3 * statistics.median(ts):6.2f} ms per 1000 rows (client CPU, median of {len(ts)})")
    await conn.close()


with fresh_database() as dsn:
    runtime.run(main(dsn))
