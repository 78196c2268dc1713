"""Catch-up read throughput of current_events_by_slices vs a raw asyncpg SELECT, same run.

Fills a fresh database with N events (10k entities, JSON payloads, spread over an hour of
db_timestamps), then reads them all in 4 slice ranges: (a) raw: one asyncpg fetch per range of
the same columns, ordered the same way, no deserialization; (b) the journal:
``current_events_by_slices`` per range (paged windows, envelopes, offsets, JSON decoding).

    python benchmarks/read_throughput.py [--events 1000000] [--buffer-size 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import asyncpg

from journal import JournalSettings, open_journal, slice_for, slice_ranges

try:
    from benchmarks._common import fresh_database, header, report
except ImportError:  # run as a script from benchmarks/
    from _common import fresh_database, header, report  # type: ignore[no-redef]

ENTITIES = 10_000
FILL = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
  event_ser_manifest, event_payload, writer)
SELECT s, 'bench', p, n, now() - interval '1 hour' + (i * $5::float8) * interval '1 microsecond',
  1, '', b, 'w'
FROM unnest($1::int[], $2::text[], $3::bigint[], $4::bytea[], $6::bigint[]) AS t(s, p, n, b, i)"""
RAW = """
SELECT persistence_id, entity_type, slice, seq_nr, db_timestamp, event_ser_id, event_ser_manifest,
  event_payload, writer, tags, meta_ser_id, meta_ser_manifest, meta_payload, deleted
FROM event_journal WHERE entity_type = 'bench' AND slice BETWEEN $1 AND $2 AND deleted = false
ORDER BY db_timestamp, seq_nr, persistence_id"""


async def fill(dsn: str, events: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        step = 3_600_000_000 / events  # microseconds between events: one hour in all
        slices = [slice_for(f"bench|{e}") for e in range(ENTITIES)]
        batch = 20_000
        for start in range(0, events, batch):
            idx = range(start, min(events, start + batch))
            await conn.execute(
                FILL,
                [slices[i % ENTITIES] for i in idx],
                [f"bench|{i % ENTITIES}" for i in idx],
                [i // ENTITIES + 1 for i in idx],
                [json.dumps({"item": f"sku-{i % 977}", "qty": i % 7 + 1}).encode() for i in idx],
                step,
                list(idx),
            )
        await conn.execute("VACUUM ANALYZE event_journal")
    finally:
        await conn.close()


async def raw_read(dsn: str) -> tuple[int, float]:
    conn = await asyncpg.connect(dsn)
    try:
        n = 0
        t = time.perf_counter()
        for lo, hi in slice_ranges(4):
            n += len(await conn.fetch(RAW, lo, hi))
        return n, time.perf_counter() - t
    finally:
        await conn.close()


async def journal_read(dsn: str, buffer_size: int) -> tuple[int, float]:
    settings = JournalSettings.load(env={}, dsn=dsn, buffer_size=buffer_size)
    async with open_journal(dsn, settings=settings) as j:
        n = 0
        t = time.perf_counter()
        for lo, hi in slice_ranges(4):
            async for _ in j.current_events_by_slices("bench", lo, hi):
                n += 1
        return n, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--buffer-size", type=int, default=1000)
    args = ap.parse_args()
    header(f"read throughput: catch up over {args.events:,} events in 4 slice ranges")
    with fresh_database() as dsn:
        t = time.perf_counter()
        asyncio.run(fill(dsn, args.events))
        print(f"# filled in {time.perf_counter() - t:.1f}s")
        # raw first and last, journal in between: the best raw figure is the ceiling
        n_raw, t_raw = asyncio.run(raw_read(dsn))
        n_j, t_j = asyncio.run(journal_read(dsn, args.buffer_size))
        n_raw2, t_raw2 = asyncio.run(raw_read(dsn))
        assert n_j == n_raw == n_raw2 == args.events, (n_j, n_raw, args.events)
        raw = n_raw / min(t_raw, t_raw2)
        report(f"current_events_by_slices (buffer {args.buffer_size})", n_j / t_j, raw, target=0.6)


if __name__ == "__main__":
    main()
