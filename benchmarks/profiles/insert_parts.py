"""The server CPU of a replicated batch's INSERT, part by part (issue 37 item 1): the journal's
statement (``insert_replicated``) against variants without one part each, and a raw ``unnest``
INSERT of the same rows, each into its own fresh database, batch by batch in turn, the backend's
CPU read from /proc/PID/schedstat (nanoseconds, robust to the machine's load). Per 1000 events.

    PYTHONPATH=. flock /tmp/sj-bench.lock .venv/bin/python benchmarks/profiles/insert_parts.py [events]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.profiles.stages_repl import read_batches
from benchmarks.replication_throughput import LOG, RAW, _raw_params, fill
from journal.postgres.embedded import start_embedded
from journal.postgres.migrations import upgrade
from journal.postgres.replicated_insert import insert_replicated
from journal.postgres.replication_part import MARK_REPLICATED
from journal.postgres.replication_sql import dump_vt
from journal.replicated import ReplicatedEvent
from journal.write_validation import replicated_batch
from tests.support.scratch import scratch_database


def cpu_ns(pid: int) -> int:
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def journal_params(events: list[ReplicatedEvent], notify: bool) -> list[Any]:
    b = replicated_batch(LOG, events)
    p: list[Any] = [
        b.persistence_ids, b.slices, b.ser_ids, b.manifests, b.payloads, None, None, None, None,
        [e.origin_location for e in events], [e.origin_seq_nr for e in events],
        [dump_vt(e.vector_time) for e in events], [e.log_seq_nr for e in events], LOG, "w", 0,
    ]  # fmt: skip
    if notify:
        p.append([f"0:{LOG}"])
    return p


def variants() -> dict[str, tuple[str, Callable[[list[ReplicatedEvent]], Any]]]:
    full = insert_replicated("public", notify=True, tagged=False)
    quiet = insert_replicated("public", notify=False, tagged=False)
    no_prev = quiet.replace(
        'LEFT JOIN LATERAL (\n    SELECT e.seq_nr, e.db_timestamp FROM "public".event_journal e\n'
        "    WHERE e.persistence_id = p.persistence_id ORDER BY e.seq_nr DESC LIMIT 1\n  ) h ON true",
        "LEFT JOIN (SELECT NULL::bigint AS seq_nr, NULL::timestamptz AS db_timestamp) h ON true",
    )
    no_prev = no_prev.replace("COALESCE(prev.seq_nr, 0) +", "i.origin_seq +")
    assert no_prev != quiet
    no_window = no_prev.replace(
        "i.origin_seq + row_number() OVER (PARTITION BY i.persistence_id ORDER BY i.n)", "i.origin_seq"
    )
    assert no_window != no_prev
    return {
        "journal statement": (full, lambda ev: journal_params(ev, True)),
        "  without NOTIFY": (quiet, lambda ev: journal_params(ev, False)),
        "  without NOTIFY, pid probe": (no_prev, lambda ev: journal_params(ev, False)),
        "  without NOTIFY, probe, window": (no_window, lambda ev: journal_params(ev, False)),
        "raw unnest INSERT": (RAW, lambda ev: _raw_params(ev)),
    }


async def run(dsns: dict[str, str], batches: list[list[ReplicatedEvent]]) -> None:
    conns = {k: await asyncpg.connect(d) for k, d in dsns.items()}
    spent: dict[str, list[float]] = {k: [] for k in dsns}
    vs = variants()
    try:
        for events in batches:
            for name, (sql, params) in vs.items():
                conn = conns[name]
                p = params(events)
                before = cpu_ns(conn.get_server_pid())
                async with conn.transaction():
                    if name != "raw unnest INSERT":
                        await conn.execute(MARK_REPLICATED)
                    await conn.execute(sql, *p)
                spent[name].append((cpu_ns(conn.get_server_pid()) - before) / len(events) / 1000)
    finally:
        for c in conns.values():
            await c.close()
    print("server CPU per 1000 events (median over batches, first two left out):")
    for name, got in spent.items():
        print(f"  {name:<30} {statistics.median(got[2:]):6.2f} ms")


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    with tempfile.TemporaryDirectory() as d:
        server = start_embedded(Path(d) / "pg")
        with scratch_database(server, "ipa") as a:
            names = list(variants())
            dbs = {}
            import contextlib

            with contextlib.ExitStack() as stack:
                for i, n in enumerate(names):
                    dbs[n] = stack.enter_context(scratch_database(server, f"ip{i}"))
                for dsn in (a, *dbs.values()):
                    upgrade(dsn)
                asyncio.run(fill(a, events))
                got = asyncio.run(read_batches(a, 1000))
                asyncio.run(run(dbs, [e for e, _ in got]))


if __name__ == "__main__":
    main()
