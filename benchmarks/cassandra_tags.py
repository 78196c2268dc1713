"""Events-by-tag catch-up on Cassandra vs a raw paged SELECT of the same tag_views partitions,
in the same run. ``--events`` tagged events of ``--pids`` entities are written through the
journal first; then the journal's current_events_by_tag reads them all (gap checks, envelopes,
deserialization) and the raw driver reads the same (tag, bucket) partitions page by page with
the same page size, in paired rounds whose order is rotated each round (the machine is shared):
the median of the rounds' ratios. Uses CASSANDRA_CONTACT_POINTS,
else starts a local node through the project's runner. Run it alone (flock /tmp/sj-bench.lock).

    python -m benchmarks.cassandra_tags [--events 20000] [--pids 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta

from journal import JournalSettings, open_journal
from journal.buckets import BUCKET_MILLIS, parse_first_bucket

try:
    from benchmarks._cassandra import BenchCassandra, cassandra_keyspace
    from benchmarks._common import alternate, header
except ImportError:  # run as a script from benchmarks/
    from _cassandra import BenchCassandra, cassandra_keyspace  # type: ignore[no-redef]
    from _common import alternate, header  # type: ignore[no-redef]

TAG = "bench"


def settings() -> JournalSettings:
    first = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y%m%dT%H:00")
    return JournalSettings.load(env={}, first_time_bucket=first, eventual_consistency_delay=0.0,
                                single_writer_check=False)  # fmt: skip


async def write(c: BenchCassandra, events: int, pids: int) -> float:
    async with open_journal(c.dsn, settings=settings()) as j:

        async def entity(p: int) -> None:
            for n in range(0, events // pids, 10):
                await j.persist(f"T|{p}", [{"n": n + k, "p": p} for k in range(10)], tags=[TAG])

        start = time.perf_counter()
        await asyncio.gather(*(entity(p) for p in range(pids)))
        return events / (time.perf_counter() - start)


async def catch_up(c: BenchCassandra, expected: int) -> float:
    async with open_journal(c.dsn, settings=settings()) as j:
        start = time.perf_counter()
        count = 0
        async for _ in j.current_events_by_tag(TAG):
            count += 1
        elapsed = time.perf_counter() - start
    assert count == expected, count
    return count / elapsed


def raw_paged(c: BenchCassandra, expected: int, page: int) -> float:
    """Every bucket from first_time_bucket to now, as the query reads them, paged by the driver."""
    s = settings().tags
    stmt = c.session.prepare(
        f"SELECT tag_name, timebucket, timestamp, persistence_id, tag_pid_sequence_nr, sequence_nr, writer_uuid, "
        f"ser_id, ser_manifest, event, meta_ser_id, meta_ser_manifest, meta FROM {c.keyspace}.tag_views "
        "WHERE tag_name = ? AND timebucket = ?"
    )
    stmt.fetch_size = page
    first = parse_first_bucket(s.first_time_bucket, s.bucket_size)
    now = int(time.time() * 1000)
    start = time.perf_counter()
    count = 0
    for bucket in range(first, now + 1, BUCKET_MILLIS[s.bucket_size]):
        for _row in c.session.execute(stmt, (TAG, bucket)):
            count += 1
    elapsed = time.perf_counter() - start
    assert count == expected, count
    return count / elapsed


def main(args: argparse.Namespace) -> None:
    header("cassandra_tags")
    events = args.events - args.events % (10 * args.pids)
    with cassandra_keyspace() as c:
        w = asyncio.run(write(c, events, args.pids))
        page = settings().tags.query_page_size
        rounds = alternate(args.rounds, {
            "raw": lambda _: raw_paged(c, events, page),
            "journal": lambda _: asyncio.run(catch_up(c, events)),
        })  # fmt: skip
        print(f"# {events} tagged events of {args.pids} pids written at {w:,.0f} ev/s (10 per call); page {page}")
        rounds.report("events_by_tag catch-up (vs raw paged SELECT)", "journal", "raw", "ev/s", target=0.7)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--pids", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3, help="paired rounds (each side once per round)")
    main(p.parse_args())
