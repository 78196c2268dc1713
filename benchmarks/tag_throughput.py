"""Tagged writes and events_by_tag catch-up on PostgreSQL, beside untagged writes and a raw
asyncpg SELECT ceiling, in the same run. Usage:
    JOURNAL_DSN=postgresql://postgres@127.0.0.1:5432/<db> python benchmarks/tag_throughput.py [N]
(the database must be migrated: `journal migrate`). Prints events/s and ratios."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import asyncpg

from journal import JournalSettings, open_journal


async def main(n: int) -> None:
    dsn = os.environ["JOURNAL_DSN"]
    s = JournalSettings.load(env={}, dsn=dsn, eventual_consistency_delay=0.0)
    conn = await asyncpg.connect(dsn)
    await conn.execute("TRUNCATE event_journal, tag_views, tag_view_settings")
    async with open_journal(dsn, settings=s) as j:
        async def run(tags: list[str]) -> float:
            t0 = time.perf_counter()
            await asyncio.gather(*(j.persist(f"B|{'t' if tags else 'u'}{i % 200}", [{"i": i}], tags=tags) for i in range(n)))
            return n / (time.perf_counter() - t0)

        untagged = await run([])
        tagged = await run(["bench"])
        t0 = time.perf_counter()
        count = 0
        async for _ in j.current_events_by_tag("bench"):
            count += 1
        catchup = count / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    rows = await conn.fetch("SELECT * FROM event_journal WHERE entity_type = 'B' ORDER BY db_timestamp, seq_nr")
    raw = len(rows) / (time.perf_counter() - t0)
    await conn.close()
    print(f"load average: {os.getloadavg()}")
    print(f"untagged writes:        {untagged:10.0f} events/s")
    print(f"tagged writes:          {tagged:10.0f} events/s  (ratio to untagged {tagged / untagged:.2f})")
    print(f"events_by_tag catch-up: {catchup:10.0f} events/s  ({count} events)")
    print(f"raw asyncpg SELECT:     {raw:10.0f} rows/s    (catch-up ratio {catchup / raw:.2f})")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20000))
