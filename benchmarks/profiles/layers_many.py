"""persist_many's client CPU layer by layer (issue 37 item 3): 1000 one-event Write parts
built beforehand, each variant adding one layer over the one before, in turn, process_time
medians: (1) checking and serializing the parts and the statements' parameters, with the two
statements sent at once on two connections (the floor of the journal's path); (2) the
backend's write_batch of the two pieces (connections taken and given back, the answer read);
(3) the group commit's submit_chunks (its idle path, the metrics); (4) the whole call with its
outcomes; and raw code building, serializing and inserting the same rows."""

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


async def main(dsn, R):
    conns = [await asyncpg.connect(dsn) for _ in range(2)]
    w = str(uuid.uuid4())
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
        backend, gc_, validator = j.backend, j._group_commit, j._validator

        def pieces(parts):
            (whole,) = validator.chunks(parts, 1000)
            return gc_._pieces(whole)

        async def floor(parts):
            built = [backend.statements.statement(b, backend.writer_id, 0) for b in pieces(parts)]
            await asyncio.gather(*[c.fetchrow(s, *p) for c, (s, p) in zip(conns, built, strict=True)])

        async def floor_writers(parts):
            built = [backend.statements.statement(b, backend.writer_id, 0) for b in pieces(parts)]
            taken = [await backend.take_writer() for _ in built]
            await asyncio.gather(*[c.fetchrow(s, *p) for c, (s, p) in zip(taken, built, strict=True)])
            for c in taken:
                backend.release_writer(c)

        async def write_batch(parts):
            await asyncio.gather(*map(backend.write_batch, pieces(parts)))

        async def submit(parts):
            await gc_.submit_chunks(validator.chunks(parts, 1000))

        async def raw(n, k):
            names = [f"raw{k}|{e}" for e in range(1000)]
            t = time.process_time()
            await conns[0].execute(
                RAW_INSERT, [slice_for(p) for p in names], names, [n + 1] * 1000,
                [orjson.dumps(payload(n)) for _ in names], w,
            )  # fmt: skip
            return time.process_time() - t

        def timed(f):
            async def run(n, k):
                parts = [Write(f"v{k}|{e}", [payload(n)], n) for e in range(1000)]
                t = time.process_time()
                await f(parts)
                return time.process_time() - t

            return run

        variants = {
            "(1) checked, params, 2 x fetchrow": timed(floor),
            "(1b) the same on the writer conns": timed(floor_writers),
            "(2) + backend.write_batch": timed(write_batch),
            "(3) + group commit submit_chunks": timed(submit),
            "(4) persist_many (+ outcomes)": timed(j.persist_many),
            "raw (building its rows too)": raw,
        }
        times = {k: [] for k in variants}
        for n in range(R):
            for k, name in enumerate(variants):
                times[name].append(await variants[name](n, k))
    for name, ts in times.items():
        print(f"{name:<36} {1e3 * statistics.median(ts[5:]):.2f} ms client CPU per 1000 parts")
    for c in conns:
        await c.close()


with fresh_database() as dsn:
    runtime.run(main(dsn, int(sys.argv[1]) if len(sys.argv) > 1 else 80))
