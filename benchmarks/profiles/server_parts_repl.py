"""Which server processes the server CPU of a replication round is (issue 37 item 1): the
benchmark's "server (A and B)" figure counts every process of the postmaster, so a raw write side
run just before (its database's autovacuum) or the WAL writer would count as replication's.
Runs a raw ``unnest`` write of the same rows into one database, then a replication A -> B (A's
endpoint a process) into another, and prints the CPU per 1000 events of each server process
(by its title: a backend's database, autovacuum, walwriter, checkpointer...) during the
replication, then each database's autovacuum count.

    PYTHONPATH=. flock /tmp/sj-bench.lock .venv/bin/python benchmarks/profiles/server_parts_repl.py [events]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import asyncpg

from benchmarks._common import _stat
from benchmarks.replication_throughput import (
    LOG,
    Cpu,
    endpoint,
    fill,
    free_address,
    raw_write,
    read_all,
    ready,
    replicate,
    stamp_all,
)
from journal import JournalSettings, open_journal
from journal.postgres.backend import PostgresBackend
from journal.postgres.embedded import start_embedded
from journal.postgres.migrations import upgrade
from journal.postgres.replication_store import PostgresReplicationStore
from tests.support.scratch import scratch_database


def server_processes(postmaster: int) -> dict[int, tuple[str, float]]:
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        st = _stat(int(d))
        if st is None or st[0] != postmaster:
            continue
        try:
            title = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        out[int(d)] = (title, st[1])
    return out


def kind(title: str) -> str:
    words = title.split()
    if len(words) >= 4 and words[0].startswith("postgres:") and "@" not in title:
        return " ".join(words[1:3])
    return " ".join(w for w in words[1:4] if "[" not in w)


async def run(a: str, b: str, r: str, tmp: Path, events: int) -> None:
    await fill(a, events)
    async with open_journal(a, settings=JournalSettings.load(dsn=a)) as ja:
        assert isinstance(ja.backend, PostgresBackend)
        store = PostgresReplicationStore(ja.backend, "A")
        await store.ensure_log(LOG)
        await stamp_all(store)
        batches = await read_all(store, 1000)
        async with ja.backend.pool.acquire() as pooled:
            postmaster = _stat(pooled.get_server_pid())[0]  # type: ignore[index]
    print(f"raw INSERT side: {await raw_write(r, batches):,.0f} ev/s")
    address = free_address()
    cfg = {"location": "A", "dsn": a, "listen": address, "logs": [LOG], "batch_size": 1000}
    with endpoint(tmp, cfg) as proc:
        await ready(address)
        cpu = Cpu()
        cpu.endpoint_pid = proc.pid
        before, total0 = server_processes(postmaster), _stat(postmaster, with_children=True)
        rate = await replicate(b, address, 1000, events, cpu)
        after, total1 = server_processes(postmaster), _stat(postmaster, with_children=True)
    print(f"replication: {rate:,.0f} ev/s; CPU per 1000 events: {cpu.line()}")
    by_kind: dict[str, float] = defaultdict(float)
    for pid, (title, t) in after.items():
        by_kind[kind(title)] += t - before.get(pid, (title, 0.0))[1]
    if total0 is not None and total1 is not None:
        # the postmaster's own time and its exited children's: what exited during the round (B's
        # connections close with its journal) less what those alive before had spent by then
        gone = sum(t for pid, (_, t) in before.items() if pid not in after)
        by_kind["exited during the round (B's connections)"] = total1[1] - total0[1] - gone
    for k, t in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        if t > 0:
            print(f"  {k:<40} {t * 1e6 / events:6.2f} ms per 1000 events")
    for name, dsn in (("raw side's database", r), ("B", b)):
        conn = await asyncpg.connect(dsn)
        try:
            row = await conn.fetchrow(
                "SELECT autovacuum_count, autoanalyze_count FROM pg_stat_user_tables WHERE relname = 'event_journal'"
            )
        finally:
            await conn.close()
        assert row is not None
        print(f"{name}: autovacuum {row[0]}, autoanalyze {row[1]}")


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    with tempfile.TemporaryDirectory() as d:
        server = start_embedded(Path(d) / "pg")
        with (
            scratch_database(server, "spa") as a,
            scratch_database(server, "spb") as b,
            scratch_database(server, "spr") as r,
        ):
            for dsn in (a, b, r):
                upgrade(dsn)
            asyncio.run(run(a, b, r, Path(d), events))


if __name__ == "__main__":
    main()
