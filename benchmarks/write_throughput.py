"""Write throughput: the journal's group commit vs raw asyncpg, measured in the same run.

(a) many entities persisting concurrently (one event per call, expected_seq_nr known) vs a raw
    multi-row INSERT (unnest, 1000 rows per statement) of the same rows;
(b) one entity persisting one event at a time vs a raw single-row autocommit INSERT;
(c) persist_many: the same rows as (a), 1000 pids per call (one event each, expected_seq_nr
    known) vs the same raw multi-row INSERT.

    python benchmarks/write_throughput.py [--events 200000] [--entities 1000] [--single 3000]
        [--asyncio] [--no-gc-tuning]

Both sides run in one process, under journal.runtime.run: on uvloop and with the garbage
collector tuned (journal.runtime.tune_gc) unless the flags say otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import time
import uuid
from collections.abc import Iterator

import asyncpg
import orjson

from journal import JournalSettings, Write, failures, open_journal, runtime, slice_for

try:
    from benchmarks._common import fresh_database, header, report
except ImportError:  # run as a script from benchmarks/
    from _common import fresh_database, header, report  # type: ignore[no-redef]

RAW_BATCH = 1000
RAW_INSERT = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
  event_ser_manifest, event_payload, writer)
SELECT s, 'bench', p, n, now(), 1, '', b, $5
FROM unnest($1::int[], $2::text[], $3::bigint[], $4::bytea[]) AS t(s, p, n, b)"""
RAW_SINGLE = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
  event_ser_manifest, event_payload, writer) VALUES ($1, 'bench', $2, $3, now(), 1, '', $4, $5)"""


def payload(i: int) -> dict[str, object]:
    return {"item": f"sku-{i % 977}", "qty": i % 7 + 1, "price": 1999}


async def raw_batched(dsn: str, entities: int, per_entity: int, prefix: str = "raw") -> float:
    conn = await asyncpg.connect(dsn)
    writer = str(uuid.uuid4())
    rows = [
        (slice_for(f"{prefix}|{e}"), f"{prefix}|{e}", n, json.dumps(payload(n)).encode())
        for n in range(1, per_entity + 1)
        for e in range(entities)
    ]
    start = time.perf_counter()
    for i in range(0, len(rows), RAW_BATCH):
        chunk = rows[i : i + RAW_BATCH]
        await conn.execute(RAW_INSERT, *(list(c) for c in zip(*chunk, strict=True)), writer)
    elapsed = time.perf_counter() - start
    await conn.close()
    return len(rows) / elapsed


async def journal_concurrent(
    dsn: str, entities: int, per_entity: int, per_call: int = 1, prefix: str = "bench"
) -> tuple[float, int]:
    settings = JournalSettings.load(env={}, dsn=dsn)
    async with open_journal(dsn, settings=settings) as j:

        async def entity(e: int) -> None:
            pid = f"{prefix}{per_call}|{e}"
            for n in range(0, per_entity, per_call):
                await j.persist(pid, [payload(n + k) for k in range(per_call)], expected_seq_nr=n)

        start = time.perf_counter()
        await asyncio.gather(*(entity(e) for e in range(entities)))
        elapsed = time.perf_counter() - start
        return entities * per_entity / elapsed, j._group_commit.batches_written


class Interleaved:
    """(c), one call at a time in turn: the raw INSERT of rows built up front, the raw INSERT
    of rows built and serialized in the timed section, and ``persist_many`` of the same number
    of parts (built in its timed section, as a caller does). Turn by turn, so the table's
    growth and the shared machine's load weigh on all three alike; each sums its own time."""

    def __init__(self) -> None:
        self.seconds = {"raw": 0.0, "values": 0.0, "bulk": 0.0}
        self.client = dict.fromkeys(self.seconds, 0.0)
        self.rows = 0

    async def run(self, dsn: str, pids: int, calls: int) -> None:
        settings = JournalSettings.load(env={}, dsn=dsn)
        conn = await asyncpg.connect(dsn)
        writer = str(uuid.uuid4())
        async with open_journal(dsn, settings=settings) as j:
            await j.persist_many([Write(f"warm|{e}", [payload(e)]) for e in range(pids)])
            for n in range(calls):
                names = [f"rawc|{e}" for e in range(pids)]
                rows = ([slice_for(p) for p in names], names, [n + 1] * pids, [json.dumps(payload(n)).encode()] * pids)
                with self._timed("raw"):
                    await conn.execute(RAW_INSERT, *rows, writer)
                with self._timed("values"):
                    names = [f"rawv|{e}" for e in range(pids)]
                    await conn.execute(
                        RAW_INSERT, [slice_for(p) for p in names], names, [n + 1] * pids,
                        [orjson.dumps(payload(n)) for _ in names], writer,
                    )  # fmt: skip
                with self._timed("bulk"):
                    out = await j.persist_many([Write(f"bulk|{e}", [payload(n)], n) for e in range(pids)])
                assert not failures(out), failures(out)[:3]
                self.rows += pids
        await conn.close()

    @contextlib.contextmanager
    def _timed(self, what: str) -> Iterator[None]:
        c0, t0 = time.process_time(), time.perf_counter()
        yield
        self.seconds[what] += time.perf_counter() - t0
        self.client[what] += time.process_time() - c0

    def rate(self, what: str) -> float:
        return self.rows / self.seconds[what]

    def client_ms_per_1000(self, what: str) -> float:
        return 1e6 * self.client[what] / self.rows


async def raw_single(dsn: str, n: int, pid: str = "rawone|1") -> float:
    conn = await asyncpg.connect(dsn)
    writer = str(uuid.uuid4())
    sl = slice_for(pid)
    stmt = await conn.prepare(RAW_SINGLE)
    start = time.perf_counter()
    for i in range(1, n + 1):
        await stmt.fetch(sl, pid, i, json.dumps(payload(i)).encode(), writer)
    elapsed = time.perf_counter() - start
    await conn.close()
    return n / elapsed


async def journal_single(dsn: str, n: int, pid: str = "one|1") -> float:
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
        start = time.perf_counter()
        for i in range(n):
            await j.persist(pid, [payload(i)], expected_seq_nr=i)
        return n / (time.perf_counter() - start)


async def run(dsn: str, args: argparse.Namespace) -> None:
    per_entity = max(1, args.events // args.entities)
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    tuned = "off" if args.no_gc_tuning else f"startup heap frozen, gen0 threshold {gc.get_threshold()[0]}"
    header(f"write_throughput (both sides in one process: event loop {loop}; gc tuning {tuned})")
    # warm up both paths (connections, plans, caches)
    await raw_single(dsn, 200, "warm|raw")
    await journal_single(dsn, 200, "warm|journal")
    # the machine's load swings: alternate rounds of each side, compare the best of each
    rounds = 3
    per_round = max(1, per_entity // rounds)
    raws, ours, batches = [], [], 0
    for k in range(rounds):
        raws.append(await raw_batched(dsn, args.entities, per_round, f"rawa{k}"))
        rate, b = await journal_concurrent(dsn, args.entities, per_round, prefix=f"a{k}-")
        ours.append(rate)
        batches += b
    report(f"(a) {args.entities} entities concurrently", max(ours), max(raws), target=0.5)
    ratios = sorted(o / r for o, r in zip(ours, raws, strict=True))
    print(
        f"    best of {rounds} alternating rounds of {args.entities * per_round} events, one per call, in"
        f" {batches} group-commit batches in all; median round ratio {ratios[rounds // 2]:.2f}"
    )
    ours_a5, _ = await journal_concurrent(dsn, args.entities, per_entity - per_entity % 5, per_call=5)
    report(f"(a') {args.entities} entities, 5 events per call", ours_a5, max(raws))
    pids = min(args.entities, RAW_BATCH)
    c = Interleaved()
    await c.run(dsn, pids, max(1, args.events // pids))
    report(f"(c) persist_many, {pids} pids per call", c.rate("bulk"), c.rate("raw"), target=0.9)
    print(
        f"    {c.rows} rows each, one statement (or call) of each in turn; like for like (raw also builds and"
        f" serializes its rows in the timed section): raw {c.rate('values'):,.0f} rows/s,"
        f" ratio {c.rate('bulk') / c.rate('values'):.2f}"
    )
    print(
        f"    client CPU per 1000 rows: raw {c.client_ms_per_1000('raw'):.2f} ms, raw from values"
        f" {c.client_ms_per_1000('values'):.2f} ms, persist_many {c.client_ms_per_1000('bulk'):.2f} ms"
        " (including building its Write parts)"
    )
    raw_b = await raw_single(dsn, args.single)
    ours_b = await journal_single(dsn, args.single)
    report("(b) one entity, one event per call", ours_b, raw_b, target=0.85)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--entities", type=int, default=1000)
    p.add_argument("--single", type=int, default=3000)
    p.add_argument("--asyncio", action="store_true", help="the standard event loop instead of uvloop (both sides)")
    p.add_argument("--no-gc-tuning", action="store_true", help="without journal.runtime.tune_gc (both sides)")
    args = p.parse_args()
    with fresh_database() as dsn:
        runtime.run(run(dsn, args), uvloop=not args.asyncio, gc_tuning=not args.no_gc_tuning)
