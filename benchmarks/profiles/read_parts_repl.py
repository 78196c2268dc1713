"""The server CPU of A's read path per 1000 events (issue 37 item 1), statement by statement: the
endpoint's ``read_log`` (every column a target needs, the vector time as jsonb), the same without
the vector time, without the payload, the stamp check a read makes first, the target progress it
records, and a local slice read's own query over the same rows; each run over the whole log in
batches of 1000, in turn, the backend's CPU read from /proc/PID/schedstat (robust to the load).

    PYTHONPATH=. flock /tmp/sj-bench.lock .venv/bin/python benchmarks/profiles/read_parts_repl.py [events]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

import asyncpg

from benchmarks.replication_throughput import LOG, fill, stamp_all
from journal import JournalSettings, open_journal
from journal.postgres.backend import PostgresBackend
from journal.postgres.embedded import start_embedded
from journal.postgres.migrations import upgrade
from journal.postgres.replication_sql import statements_for
from journal.postgres.replication_store import PostgresReplicationStore
from tests.support.scratch import scratch_database


def cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


async def run(a: str, events: int) -> None:
    await fill(a, events)
    async with open_journal(a, settings=JournalSettings.load(dsn=a)) as ja:
        assert isinstance(ja.backend, PostgresBackend)
        store = PostgresReplicationStore(ja.backend, "A")
        await store.ensure_log(LOG)
        await stamp_all(store)
    sql = statements_for("public")
    cols = sql.read_log.split("SELECT ", 1)[1].split(" FROM", 1)[0]
    variants = {
        "read_log (as the endpoint)": sql.read_log,
        "read_log, vector_time::text": sql.read_log.replace("vector_time,", "vector_time::text,"),
        "read_log without vector_time": sql.read_log.replace("vector_time, ", ""),
        "read_log without payload": sql.read_log.replace("event_payload, ", ""),
        "log_seq_nr only (the index walk)": sql.read_log.replace(cols, "log_seq_nr"),
    }
    conn = await asyncpg.connect(a)
    try:
        pid = conn.get_server_pid()
        per: dict[str, list[float]] = {k: [] for k in (*variants, "stamp check (any_unstamped)", "target progress")}
        for _ in range(3):
            for name, q in variants.items():
                await conn.fetch(q, LOG, 0, 1000)  # planned and cached
                c0, after = cpu_ns(pid), 0
                while rows := await conn.fetch(q, LOG, after, 1000):
                    after = int(rows[-1]["log_seq_nr"])
                per[name].append((cpu_ns(pid) - c0) / events / 1000)
            c0 = cpu_ns(pid)
            for _ in range(events // 1000):
                await conn.fetchval(sql.any_unstamped(LOG), None)
            per["stamp check (any_unstamped)"].append((cpu_ns(pid) - c0) / events / 1000)
            c0 = cpu_ns(pid)
            for k in range(events // 1000):
                await conn.execute(sql.save_target_progress, LOG, "B", k * 1000)
            per["target progress"].append((cpu_ns(pid) - c0) / events / 1000)
    finally:
        await conn.close()
    print(f"A's read path, backend CPU per 1000 events ({events} events, batches of 1000, median of 3):")
    for name, got in per.items():
        print(f"  {name:<36} {statistics.median(got):6.2f} ms")


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    with tempfile.TemporaryDirectory() as d:
        server = start_embedded(Path(d) / "pg")
        with scratch_database(server, "rpa") as a:
            upgrade(a)
            asyncio.run(run(a, events))


if __name__ == "__main__":
    main()
