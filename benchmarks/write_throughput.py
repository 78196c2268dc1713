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
import gc
import json
import time
import uuid

import asyncpg
import orjson

from journal import JournalSettings, Write, failures, open_journal, runtime, slice_for

try:
    from benchmarks._common import CpuMeter, GcMeter, fresh_database, header, report
except ImportError:  # run as a script from benchmarks/
    from _common import CpuMeter, GcMeter, fresh_database, header, report  # type: ignore[no-redef]

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


async def raw_batched(
    dsn: str, entities: int, per_entity: int, prefix: str = "raw", cpu: CpuMeter | None = None
) -> float:
    conn = await asyncpg.connect(dsn)
    writer = str(uuid.uuid4())
    rows = [
        (slice_for(f"{prefix}|{e}"), f"{prefix}|{e}", n, json.dumps(payload(n)).encode())
        for n in range(1, per_entity + 1)
        for e in range(entities)
    ]
    if cpu:
        cpu.start()
    start = time.perf_counter()
    for i in range(0, len(rows), RAW_BATCH):
        chunk = rows[i : i + RAW_BATCH]
        await conn.execute(RAW_INSERT, *(list(c) for c in zip(*chunk, strict=True)), writer)
    elapsed = time.perf_counter() - start
    if cpu:
        cpu.stop()
    await conn.close()
    return len(rows) / elapsed


async def raw_from_values(dsn: str, entities: int, per_entity: int, prefix: str) -> float:
    """The raw multi-row INSERT starting, like the journal, from Python values: rows built and
    payloads serialized (with orjson, the journal's serializer) inside the timed loop."""
    conn = await asyncpg.connect(dsn)
    writer = str(uuid.uuid4())
    start = time.perf_counter()
    for n in range(1, per_entity + 1):
        for e0 in range(0, entities, RAW_BATCH):
            es = range(e0, min(entities, e0 + RAW_BATCH))
            pids = [f"{prefix}|{e}" for e in es]
            await conn.execute(
                RAW_INSERT, [slice_for(p) for p in pids], pids, [n] * len(pids),
                [orjson.dumps(payload(n)) for _ in es], writer,
            )  # fmt: skip
    elapsed = time.perf_counter() - start
    await conn.close()
    return entities * per_entity / elapsed


async def journal_concurrent(
    dsn: str, entities: int, per_entity: int, per_call: int = 1, cpu: CpuMeter | None = None
) -> tuple[float, int]:
    settings = JournalSettings.load(env={}, dsn=dsn)
    async with open_journal(dsn, settings=settings) as j:

        async def entity(e: int) -> None:
            pid = f"bench{per_call}|{e}"
            for n in range(0, per_entity, per_call):
                await j.persist(pid, [payload(n + k) for k in range(per_call)], expected_seq_nr=n)

        if cpu:
            cpu.start()
        start = time.perf_counter()
        await asyncio.gather(*(entity(e) for e in range(entities)))
        elapsed = time.perf_counter() - start
        if cpu:
            cpu.stop()
        return entities * per_entity / elapsed, j._group_commit.batches_written


async def journal_bulk(
    dsn: str,
    entities: int,
    per_entity: int,
    prefix: str = "bulk",
    cpu: CpuMeter | None = None,
    gc_meter: GcMeter | None = None,
) -> float:
    settings = JournalSettings.load(env={}, dsn=dsn)
    async with open_journal(dsn, settings=settings) as j:
        await j.persist_many([Write(f"warm|{e}", [payload(e)]) for e in range(RAW_BATCH)])
        if cpu:
            cpu.start()
        if gc_meter:
            gc_meter.start()
        start = time.perf_counter()
        for n in range(per_entity):
            for e0 in range(0, entities, RAW_BATCH):
                out = await j.persist_many(
                    [Write(f"{prefix}|{e}", [payload(n)], n) for e in range(e0, min(entities, e0 + RAW_BATCH))]
                )
                assert not failures(out), failures(out)[:3]
        elapsed = time.perf_counter() - start
        if gc_meter:
            gc_meter.stop()
        if cpu:
            cpu.stop()
        return entities * per_entity / elapsed


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
    probe = await asyncpg.connect(dsn)
    cpu_raw_a, cpu_a = CpuMeter(probe.get_server_pid()), CpuMeter(probe.get_server_pid())
    await probe.close()
    raw_a = await raw_batched(dsn, args.entities, per_entity, cpu=cpu_raw_a)
    ours_a, batches = await journal_concurrent(dsn, args.entities, per_entity, cpu=cpu_a)
    report(f"(a) {args.entities} entities concurrently", ours_a, raw_a, target=0.5)
    print(f"    {args.entities * per_entity} events, one per call, in {batches} group-commit batches")
    rows_a = args.entities * per_entity
    if cpu_a.server is not None and cpu_raw_a.server is not None:
        print(
            f"    CPU per 1000 rows (client + server): raw {1e6 * cpu_raw_a.client / rows_a:.2f} + "
            f"{1e6 * cpu_raw_a.server / rows_a:.2f} ms, journal {1e6 * cpu_a.client / rows_a:.2f} + "
            f"{1e6 * cpu_a.server / rows_a:.2f} ms"
        )
    ours_a5, _ = await journal_concurrent(dsn, args.entities, per_entity - per_entity % 5, per_call=5)
    report(f"(a') {args.entities} entities, 5 events per call", ours_a5, raw_a)
    # the machine's load swings both sides: alternate short rounds, compare the best of each
    # (and show the median of the per-round ratios)
    rounds, raws, bulks = 5, [], []
    per_round = max(1, per_entity // rounds)
    probe = await asyncpg.connect(dsn)
    cpu_raw, cpu_bulk = CpuMeter(probe.get_server_pid()), CpuMeter(probe.get_server_pid())
    await probe.close()
    cpu_used = [0.0, 0.0, 0.0, 0.0]  # raw client, raw server, bulk client, bulk server
    gc_bulk = GcMeter()
    for k in range(rounds):
        raws.append(await raw_batched(dsn, args.entities, per_round, f"rawc{k}", cpu_raw))
        bulks.append(await journal_bulk(dsn, args.entities, per_round, f"bulk{k}", cpu_bulk, gc_bulk))
        for i, v in enumerate((cpu_raw.client, cpu_raw.server, cpu_bulk.client, cpu_bulk.server)):
            cpu_used[i] += v or 0.0
    report(f"(c) persist_many, {min(args.entities, RAW_BATCH)} pids per call", max(bulks), max(raws), target=0.9)
    ratios = sorted(b / r for b, r in zip(bulks, raws, strict=True))
    print(
        f"    best of {rounds} alternating rounds of {args.entities * per_round} rows; median round ratio "
        f"{ratios[rounds // 2]:.2f}; raw {min(raws):,.0f}..{max(raws):,.0f}, ours {min(bulks):,.0f}..{max(bulks):,.0f}"
    )
    values = [await raw_from_values(dsn, args.entities, per_round, f"rawv{k}") for k in range(2)]
    print(
        f"    like for like (raw also builds and serializes its rows in the timed loop): raw {max(values):,.0f} rows/s,"
        f" ratio {max(bulks) / max(values):.2f}"
    )
    rows_c = rounds * args.entities * per_round
    if cpu_raw.server is not None:
        rc, rs, bc, bs = (1e6 * v / rows_c for v in cpu_used)
        print(
            f"    CPU per 1000 rows (client + server): raw {rc:.2f} + {rs:.2f} ms, persist_many {bc:.2f} + {bs:.2f} ms;"
            f" CPU ratio {(rc + rs) / (bc + bs):.2f}; of the client's, {1e6 * gc_bulk.seconds / rows_c:.2f} ms"
            " in the garbage collector"
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
