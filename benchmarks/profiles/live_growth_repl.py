"""Does replication's latency to B's live query grow with B's table? (issue 37 item 1.) Endpoints A
and B in this process (update notifications on), B's live slice query over all slices in this
process too: ``events`` one at a time (each after the previous was delivered, then 50 ms), then
``bulk`` events written at A at 5,000/s (distinct pids) and caught up, twice, each followed by the
same one-at-a-time measurement. Printed per phase: persist -> delivered, and B's write commit ->
delivered (the live query's part).

    PYTHONPATH=. flock /tmp/sj-bench.lock .venv/bin/python benchmarks/profiles/live_growth_repl.py [bulk] [events]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.replication_throughput import LOG, free_address
from journal import Journal, JournalSettings, open_journal, runtime
from journal.postgres.embedded import start_embedded
from journal.postgres.migrations import upgrade
from journal.replication.config import EndpointConfig
from journal.replication.endpoint import ReplicationEndpoint
from tests.support.scratch import scratch_database


class Follow:
    """B's live query: each measured event's delivery time, and the last write commit at B."""

    def __init__(self, eb: ReplicationEndpoint) -> None:
        self.due: dict[str, float] = {}
        self.got: list[tuple[float, float]] = []
        self.delivered = asyncio.Event()
        self.count = 0
        self.write_end = 0.0
        write = eb.store.write_replicated

        async def timed(*a: Any, **k: Any) -> Any:
            out = await write(*a, **k)
            self.write_end = time.perf_counter()
            return out

        eb.store.write_replicated = timed  # type: ignore[method-assign]

    async def run(self, jb: Journal) -> None:
        async for env in jb.events_by_slices(LOG, 0, 1023):
            self.count += 1
            key = env.event.get("lat")
            if key in self.due:
                now = time.perf_counter()
                self.got.append((now - self.due.pop(key), now - self.write_end))
                self.delivered.set()


async def one_at_a_time(ja: Journal, follow: Follow, tag: str, events: int) -> None:
    follow.got.clear()
    for i in range(events):
        follow.delivered.clear()
        follow.due[f"{tag}{i}"] = time.perf_counter()
        await ja.persist(f"{LOG}|{tag}{i}", [{"lat": f"{tag}{i}"}])
        await follow.delivered.wait()
        await asyncio.sleep(0.05)
    total = statistics.median(g[0] for g in follow.got) * 1000
    live = statistics.median(g[1] for g in follow.got) * 1000
    print(f"{tag:<6} delivered p50 {total:5.1f} ms; B's commit -> delivered p50 {live:4.1f} ms", flush=True)


async def at_rate(ja: Journal, follow: Follow, tag: str, total: int) -> None:
    start, done, before = time.perf_counter(), 0, follow.count
    while done < total:
        due = min(total, int((time.perf_counter() - start) * 5000) + 1)
        if due > done:
            await ja.persist_many([(f"{LOG}|{tag}-{k}", [{"k": k}]) for k in range(done, due)])
            done = due
        await asyncio.sleep(0.001)
    while follow.count < before + total:  # noqa: ASYNC110 (caught up)
        await asyncio.sleep(0.05)


async def main(a: str, b: str, bulk: int, events: int) -> None:
    addr_a, addr_b = free_address(), free_address()
    common = {"logs": [LOG], "retry_delay": 5.0, "update_notifications": True}
    ca = EndpointConfig.from_dict({"location": "A", "dsn": a, "listen": addr_a, **common})
    cb = EndpointConfig.from_dict(
        {"location": "B", "dsn": b, "listen": addr_b, "connections": [{"address": addr_a}], **common}
    )
    async with (
        ReplicationEndpoint(ca),
        ReplicationEndpoint(cb) as eb,
        open_journal(a, settings=JournalSettings.load(dsn=a)) as ja,
        open_journal(b, settings=JournalSettings.load(dsn=b)) as jb,
    ):
        follow = Follow(eb)
        task = asyncio.create_task(follow.run(jb))
        await one_at_a_time(ja, follow, "warm", 5)
        await one_at_a_time(ja, follow, "start", events)
        for r in range(2):
            await at_rate(ja, follow, f"r{r}", bulk)
            await one_at_a_time(ja, follow, f"+{(r + 1) * bulk}", events)
        task.cancel()


if __name__ == "__main__":
    bulk = int(sys.argv[1]) if len(sys.argv) > 1 else 15000
    events = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with tempfile.TemporaryDirectory() as d:
        server = start_embedded(Path(d) / "pg")
        with scratch_database(server, "lga") as a, scratch_database(server, "lgb") as b:
            upgrade(a)
            upgrade(b)
            runtime.run(main(a, b, bulk, events))
