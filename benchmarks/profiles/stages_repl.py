"""Where B's time goes when it writes replicated batches (issue 37 item 1): each statement of
``write_replicated`` timed apart (asyncpg's query logger: wall time per statement kind), the
server's CPU per event (the server's processes, from /proc), the client's CPU, and the plan of
the batch INSERT (EXPLAIN ANALYZE of one batch, rolled back). Beside it the ceiling of B's
side: a raw ``unnest`` INSERT of the same rows with every replication column, one transaction per
batch, into a fresh database with the same indexes.

The batches are read from A first (in memory), so this is B's side alone, without gRPC.

    PYTHONPATH=. flock /tmp/sj-bench.lock .venv/bin/python benchmarks/profiles/stages_repl.py [events] [batch]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks._common import CpuMeter
from benchmarks.replication_throughput import LOG, fill
from journal import JournalSettings, open_journal
from journal.postgres.backend import PostgresBackend
from journal.postgres.embedded import start_embedded
from journal.postgres.migrations import upgrade
from journal.postgres.replication_store import PostgresReplicationStore
from journal.replicated import ReplicatedEvent
from tests.support.scratch import scratch_database

RAW = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
  event_ser_manifest, event_payload, deleted, writer, origin_location, origin_seq_nr, vector_time, log_seq_nr)
SELECT s, $1, p, n, clock_timestamp(), i, m, b, false, 'w', o, os, vt::jsonb, ls
FROM unnest($2::int[], $3::text[], $4::bigint[], $5::int[], $6::text[], $7::bytea[], $8::text[], $9::bigint[],
            $10::text[], $11::bigint[]) AS t(s, p, n, i, m, b, o, os, vt, ls)"""


def kind(sql: str) -> str:
    s = " ".join(sql.split())[:60]
    for key, name in (
        ("WITH clock", "insert (the batch)"),
        ("SELECT s.origin", "stored ids"),
        ("FOR UPDATE", "lock log row"),
        ("log_seq_nr IS NULL", "unstamped (stamp check)"),
        ("set_config", "mark replicated"),
        ("replication_progress", "progress"),
        ("UPDATE", "save log"),
        ("BEGIN", "begin"),
        ("COMMIT", "commit"),
    ):
        if key in " ".join(sql.split()):
            return name
    return s


async def read_batches(a: str, batch: int) -> list[tuple[list[ReplicatedEvent], int]]:
    async with open_journal(a, settings=JournalSettings.load(dsn=a)) as ja:
        assert isinstance(ja.backend, PostgresBackend)
        sa = PostgresReplicationStore(ja.backend, "A")
        await sa.ensure_log(LOG)
        while await sa.stamp(LOG, 5000) > 0:
            pass
        out, after = [], 0
        while True:
            events, last = await sa.read_log(LOG, after, batch)
            if not events:
                return out
            out.append((events, last))
            after = last


async def journal_side(b: str, batches: list[tuple[list[ReplicatedEvent], int]]) -> None:
    spent: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])

    def log(q: Any) -> None:
        k = kind(q.query)
        spent[k][0] += q.elapsed
        spent[k][1] += 1

    n = sum(len(e) for e, _ in batches)
    async with open_journal(b, settings=JournalSettings.load(dsn=b)) as jb:
        assert isinstance(jb.backend, PostgresBackend)
        sb = PostgresReplicationStore(jb.backend, "B")
        await sb.ensure_log(LOG)
        async with jb.backend.pool.acquire() as c:
            meter = CpuMeter(c.get_server_pid())
        for conn in jb.backend.pool._holders:
            if conn._con is not None:
                conn._con.add_query_logger(log)
        meter.start()
        t = time.perf_counter()
        for events, last in batches:
            await sb.write_replicated(LOG, "A", events, last)
        wall = time.perf_counter() - t
        meter.stop()
        print(
            f"journal write_replicated: {n / wall:,.0f} ev/s; {meter.per_1000(n)}; wall per 1000 {wall / n * 1e6:.2f} ms"
        )
        for k, (s, c) in sorted(spent.items(), key=lambda kv: -kv[1][0]):
            print(f"    {k:<28} {c:>5} x  {s / len(batches) * 1000:7.2f} ms per batch  ({s / wall:.0%} of wall)")
        # one more batch's plan (rolled back): the events again under new identities
        events, last = batches[-1]
        async with jb.backend.pool.acquire() as conn:
            plan: list[str] = []

            async def explain(sql: str, *args: Any) -> Any:
                rows = await conn.fetch("EXPLAIN (ANALYZE, BUFFERS, TIMING) " + sql, *args)
                plan.extend(r[0] for r in rows)
                return None

            import journal.postgres.replication_part as rp

            store_conn = conn
            tr = store_conn.transaction()
            await tr.start()
            try:
                await conn.execute(rp.MARK_REPLICATED)
                from journal.write_validation import replicated_batch

                renamed = [
                    ReplicatedEvent(e.persistence_id, e.event, "X", e.origin_seq_nr, e.vector_time, e.log_seq_nr,
                                    e.tags, e.metadata)
                    for e in events
                ]  # fmt: skip
                wb = replicated_batch(LOG, renamed)

                class Spy:
                    fetchrow = staticmethod(explain)

                await sb.places.home.insert(Spy(), LOG, wb, renamed, [10**9 + i for i in range(len(renamed))])
            finally:
                await tr.rollback()
        print("    plan of one batch's INSERT:")
        for line in plan:
            print("      " + line)


async def raw_side(b: str, batches: list[tuple[list[ReplicatedEvent], int]]) -> None:
    from journal import slice_for
    from journal.postgres.replication_sql import dump_vt

    n = sum(len(e) for e, _ in batches)
    params = []
    for events, _ in batches:
        params.append((
            LOG, [slice_for(e.persistence_id) for e in events], [e.persistence_id for e in events],
            [e.origin_seq_nr for e in events], [e.event.ser_id for e in events], [e.event.manifest for e in events],
            [e.event.payload for e in events], [e.origin_location for e in events],
            [e.origin_seq_nr for e in events], [dump_vt(e.vector_time) for e in events],
            [e.log_seq_nr for e in events],
        ))  # fmt: skip
    conn = await asyncpg.connect(b)
    try:
        meter = CpuMeter(conn.get_server_pid())
        meter.start()
        t = time.perf_counter()
        for p in params:
            async with conn.transaction():
                await conn.execute(RAW, *p)
        wall = time.perf_counter() - t
        meter.stop()
    finally:
        await conn.close()
    print(f"raw unnest INSERT, same rows:  {n / wall:,.0f} ev/s; {meter.per_1000(n)}")


async def pipeline(a: str, c: str, tmp: Path, batch: int, events: int) -> None:
    """The whole path over gRPC (A's endpoint a process), CPU per 1000 events of each process,
    beside a local slice read at A with its CPU."""
    from benchmarks.replication_throughput import Cpu, endpoint, free_address, local_read, ready, replicate

    async with open_journal(a, settings=JournalSettings.load(dsn=a)) as ja:
        async with ja.backend.pool.acquire() as conn:  # type: ignore[attr-defined]
            meter = CpuMeter(conn.get_server_pid())
        await local_read(ja)
        meter.start()
        rate = await local_read(ja)
        meter.stop()
        print(f"local slice read at A: {rate:,.0f} ev/s; {meter.per_1000(events)}")
        address = free_address()
        cfg = {"location": "A", "dsn": a, "listen": address, "logs": [LOG], "batch_size": batch}
        with endpoint(tmp, cfg) as proc:
            await ready(address)
            cpu = Cpu()
            cpu.endpoint_pid = proc.pid
            rate = await replicate(c, address, batch, events, cpu)
        print(f"replication over gRPC: {rate:,.0f} ev/s; CPU per 1000 events: {cpu.line()}")


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    with tempfile.TemporaryDirectory() as d:
        server = start_embedded(Path(d) / "pg")
        with (
            scratch_database(server, "spa") as a,
            scratch_database(server, "spb") as b,
            scratch_database(server, "spr") as r,
            scratch_database(server, "spc") as c,
        ):
            for dsn in (a, b, r, c):
                upgrade(dsn)
            asyncio.run(fill(a, events))
            batches = asyncio.run(read_batches(a, batch))
            asyncio.run(raw_side(r, batches))
            asyncio.run(journal_side(b, batches))
            asyncio.run(pipeline(a, c, Path(d), batch, events))


if __name__ == "__main__":
    main()
