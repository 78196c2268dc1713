"""Tagged writes and events_by_tag catch-up on PostgreSQL, beside untagged writes and a raw
asyncpg SELECT of the same tag rows (the ceiling), in the same run, on a fresh database. Usage:
    JOURNAL_DSN=postgresql://postgres@127.0.0.1:5432/postgres python -m benchmarks.tag_throughput [N]
(without JOURNAL_DSN an embedded PostgreSQL is started). Prints events/s and ratios."""

from __future__ import annotations

import asyncio
import sys
import time

import asyncpg

from benchmarks._common import fresh_database, header, report
from journal import JournalSettings, open_journal


async def main(dsn: str, n: int) -> None:
    s = JournalSettings.load(env={}, dsn=dsn, eventual_consistency_delay=0.0)
    async with open_journal(dsn, settings=s) as j:

        async def run(tags: list[str]) -> float:
            t0 = time.perf_counter()
            kind = "t" if tags else "u"
            await asyncio.gather(*(j.persist(f"B|{kind}{i % 200}", [{"i": i}], tags=tags) for i in range(n)))
            return n / (time.perf_counter() - t0)

        untagged = await run([])
        tagged = await run(["bench"])
        catchup = 0.0
        for _ in range(3):  # best of three: the machine is shared
            t0 = time.perf_counter()
            count = 0
            async for _ in j.current_events_by_tag("bench"):
                count += 1
            assert count == n, count
            catchup = max(catchup, count / (time.perf_counter() - t0))
    conn = await asyncpg.connect(dsn)
    raw = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        rows = await conn.fetch(
            "SELECT * FROM tag_views WHERE tag_name = 'bench' ORDER BY timebucket, uuid_time, timestamp"
        )
        raw = max(raw, len(rows) / (time.perf_counter() - t0))
    await conn.close()
    print(f"{'untagged writes':<44} {untagged:>10,.0f} events/s")
    report("tagged writes (vs untagged)", tagged, untagged, "ev/s")
    report("events_by_tag catch-up (vs raw SELECT)", catchup, raw)


if __name__ == "__main__":
    header("tag_throughput")
    with fresh_database() as db:
        asyncio.run(main(db, int(sys.argv[1]) if len(sys.argv) > 1 else 20000))
