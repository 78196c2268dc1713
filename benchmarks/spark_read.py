"""Rows/s of the slice-partitioned Spark reader vs Spark's plain JDBC read of the same table.

The plain read is ``spark.read.jdbc(table, column="slice", lowerBound=0, upperBound=1024,
numPartitions=N)`` with an ``entity_type`` filter (Spark's own range partitioning on slice);
ours is :func:`projections.spark.read_journal` (one predicate per slice range). Both read the same
columns, ``count()`` after forcing every row through ``sum(length(event_payload))``, same run.
Also: the time of our reader with 1, 2, 4 and 8 partitions.

    JOURNAL_TEST_DSN=postgresql://postgres@127.0.0.1:5432/postgres .venv/bin/python benchmarks/spark_read.py
    ... --events 100000   (smaller run)

Data: ``--events`` JSON events of entity type ``bench`` (10 per pid), written once by COPY into a
scratch database that is dropped at the end. Load (``os.getloadavg``) is printed: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from journal import JournalSettings, slice_for
from journal.postgres.migrations import upgrade
from projections.spark import jdbc_source, read_journal, spark_session


def _db(dsn: str, name: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + name))


async def _admin(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _fill(dsn: str, events: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        now = datetime.now(UTC)
        per_pid = 10

        def rows() -> Any:
            for i in range(events):
                pid = f"bench|{i // per_pid}"
                payload = json.dumps({"amount": i, "currency": "EUR", "note": "x" * 40}).encode()
                yield (slice_for(pid), "bench", pid, i % per_pid + 1, now, 1, "", payload, False, "w", None, None)

        cols = [
            "slice", "entity_type", "persistence_id", "seq_nr", "db_timestamp", "event_ser_id",
            "event_ser_manifest", "event_payload", "deleted", "writer", "adapter_manifest", "tags",
        ]  # fmt: skip
        batch: list[Any] = []
        for r in rows():
            batch.append(r)
            if len(batch) == 50_000:
                await conn.copy_records_to_table("event_journal", records=batch, columns=cols)
                batch = []
        if batch:
            await conn.copy_records_to_table("event_journal", records=batch, columns=cols)
        await conn.execute("ANALYZE event_journal")
    finally:
        await conn.close()


async def _raw_asyncpg(dsn: str) -> float:
    """One asyncpg connection reading the same columns and rows (cursor, 10k prefetch)."""
    conn = await asyncpg.connect(dsn)
    try:
        t = time.perf_counter()
        n = 0
        async with conn.transaction():
            async for _r in conn.cursor(
                "SELECT persistence_id, seq_nr, slice, db_timestamp, event_payload FROM event_journal "
                "WHERE entity_type = 'bench' AND NOT deleted",
                prefetch=10_000,
            ):
                n += 1
        return time.perf_counter() - t
    finally:
        await conn.close()


def _consume(df: Any) -> tuple[int, float]:
    from pyspark.sql import functions as F

    t = time.perf_counter()
    r = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("event_payload")).alias("b")).collect()[0]
    return int(r["n"]), time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000, help="events to read (default 1M)")
    ap.add_argument("--partitions", type=int, default=8, help="partitions of the head-to-head run")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each read (best is kept)")
    args = ap.parse_args()
    server = os.environ.get("JOURNAL_TEST_DSN") or os.environ.get("JOURNAL_DSN")
    if not server:
        from pathlib import Path

        from platformdirs import user_cache_dir

        from journal.postgres.embedded import start_embedded

        server = start_embedded(Path(user_cache_dir("slice-journal")) / "bench-pgdata")
    name = f"sjbench_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(server, f'CREATE DATABASE "{name}"'))
    dsn = _db(server, name)
    try:
        upgrade(dsn)
        t = time.perf_counter()
        asyncio.run(_fill(dsn, args.events))
        print(f"loaded {args.events} events in {time.perf_counter() - t:.1f} s; load avg {os.getloadavg()}")
        settings = JournalSettings.load(env={}, master=args.master, shuffle_partitions=2)
        spark = spark_session(settings.spark)
        source = jdbc_source(dsn)
        cols = ["persistence_id", "seq_nr", "slice", "db_timestamp", "event_payload"]

        def ours(n: int) -> Any:
            return read_journal(spark, source, "bench", partitions=n, fetch_size=10_000, columns=cols)

        def plain(n: int) -> Any:
            df = spark.read.jdbc(
                url=source.url,
                table=source.table("event_journal"),
                column="slice",
                lowerBound=0,
                upperBound=1024,
                numPartitions=n,
                properties=source.with_properties(fetchsize="10000"),
            )
            return df.where("entity_type = 'bench' AND NOT deleted").select(*cols)

        _consume(ours(args.partitions))  # warm-up: JVM, driver, server caches
        best: dict[str, float] = {}
        contenders = (("slice-partitioned reader", ours), ("plain Spark JDBC (numPartitions on slice)", plain))
        for _ in range(args.repeat):
            for label, make in contenders:
                n, secs = _consume(make(args.partitions))
                assert n == args.events, (label, n)
                best[label] = min(best.get(label, float("inf")), secs)
        ours_s, plain_s = best["slice-partitioned reader"], best["plain Spark JDBC (numPartitions on slice)"]
        print(f"{args.partitions} partitions, {args.events} events, master {args.master}:")
        for label, secs in best.items():
            print(f"  {label:<45} {secs:7.2f} s  {args.events / secs:12,.0f} rows/s")
        print(f"  ratio ours/plain (rows/s)                     {plain_s / ours_s:7.2f}  (target >= 0.9)")
        raw_s = asyncio.run(_raw_asyncpg(dsn))
        print(f"  raw asyncpg, one connection (ceiling ref.)    {raw_s:7.2f} s  {args.events / raw_s:12,.0f} rows/s")
        print("slice-partitioned reader by partition count:")
        for n in (1, 2, 4, 8):
            secs = min(_consume(ours(n))[1] for _ in range(args.repeat))
            print(f"  {n} partition(s) {secs:7.2f} s  {args.events / secs:12,.0f} rows/s")
        print(f"load avg at end {os.getloadavg()}")
        spark.stop()
    finally:
        asyncio.run(_admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


if __name__ == "__main__":
    main()
