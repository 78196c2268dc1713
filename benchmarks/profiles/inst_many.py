"""persist_many's client CPU, stage by stage, by wrapping the stages (process_time)."""

import statistics
import sys
import time
from collections import defaultdict

import asyncpg

import journal.journal as jj
from benchmarks._common import fresh_database
from benchmarks.write_throughput import payload
from journal import JournalSettings, Write, open_journal, runtime
from journal.postgres.write_statements import WriteStatements
from journal.write_validation import WriteValidator

acc = defaultdict(float)


def wrap_sync(owner, name, key):
    f = getattr(owner, name)

    def w(*a, **k):
        t = time.process_time()
        try:
            return f(*a, **k)
        finally:
            acc[key] += time.process_time() - t

    setattr(owner, name, w)


wrap_sync(WriteValidator, "_chunk", "validate+serialize (_chunk)")
wrap_sync(WriteStatements, "statement", "statement params")
wrap_sync(jj, "outcomes", "outcomes")


# asyncpg: time until the coroutine first suspends (encode + send), and after it resumes (decode)
def wrap_async(owner, name, key):
    f = getattr(owner, name)

    async def w(*a, **k):
        t = time.process_time()
        coro = f(*a, **k)
        r = None
        try:
            fut = coro.send(None)
            acc[key + " (to send)"] += time.process_time() - t
            while True:
                res = await _Yield(fut)
                t = time.process_time()
                fut = coro.send(res)
                acc[key + " (after)"] += time.process_time() - t
        except StopIteration as e:
            acc[key + " (after)"] += time.process_time() - t
            return e.value

    setattr(owner, name, w)


class _Yield:
    def __init__(self, fut):
        self.fut = fut

    def __await__(self):
        return (yield self.fut)


wrap_async(asyncpg.Connection, "fetchrow", "fetchrow")
wrap_async(asyncpg.Connection, "execute", "execute")

import gc

_gc_t = [0.0]


def _gccb(phase, info):
    if phase == "start":
        _gc_t[0] = time.process_time()
    else:
        acc[f"gc gen{info['generation']}"] += time.process_time() - _gc_t[0]


gc.callbacks.append(_gccb)
N, R = 1000, int(sys.argv[2]) if len(sys.argv) > 2 else 60


async def main(dsn, bif):
    settings = JournalSettings.load(env={"JOURNAL_WRITE_BULK_IN_FLIGHT": bif} if bif else {}, dsn=dsn)
    print("bulk_in_flight", settings.write.bulk_in_flight)
    async with open_journal(dsn, settings=settings) as j:
        for n in range(10):
            await j.persist_many([Write(f"w|{e}", [payload(n)], n) for e in range(N)])
        acc.clear()
        ts = []
        for n in range(10, 10 + R):
            parts = [Write(f"w|{e}", [payload(n)], n) for e in range(N)]
            t = time.process_time()
            await j.persist_many(parts)
            ts.append(time.process_time() - t)
        tot = sum(ts)
        print(
            "persist_many client CPU ms per 1000: median",
            round(1e3 * statistics.median(ts), 2),
            "mean",
            round(1e3 * tot / R, 2),
        )
        for k, v in sorted(acc.items(), key=lambda kv: -kv[1]):
            print(f"  {k:<36} {1e3 * v / R:6.2f} ms")
        print(f"  {'rest':<36} {1e3 * (tot - sum(acc.values())) / R:6.2f} ms")


with fresh_database() as dsn:
    runtime.run(main(dsn, sys.argv[1] if len(sys.argv) > 1 else ""))
