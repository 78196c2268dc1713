"""Where one replicated event's latency goes (issue 37 item 1): endpoints A and B in this
process (update notifications on), single events persisted at A one at a time, each step timed
from the persist: A's persist returned, A's endpoint notified (LISTEN), B woken by A's Watch
stream, A's read served (its stamp, its query), B's write committed. Medians and p99 over the
events, in ms.

    PYTHONPATH=. flock /tmp/sj-bench.lock .venv/bin/python benchmarks/profiles/latency_repl.py [events] [uvloop] [rate]

With ``rate``: ``events`` written at 5,000 events/s (what is due every 1 ms in one ``persist_many``),
and per step its calls per second, events per call, wall time per call and share of the time busy.

With ``uvloop`` the endpoints run on ``journal.runtime`` (uvloop), as ``journal endpoint run`` does;
without it, on asyncio's standard loop.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.replication_throughput import LOG, free_address
from journal import JournalSettings, open_journal
from journal.postgres.embedded import start_embedded
from journal.postgres.migrations import upgrade
from journal.replication.config import EndpointConfig
from journal.replication.endpoint import ReplicationEndpoint
from tests.support.scratch import scratch_database

marks: dict[str, list[float]] = defaultdict(list)
t0 = 0.0


def mark(name: str) -> None:
    marks[name].append((time.perf_counter() - t0) * 1000)


def wrap(obj: Any, name: str, before: str | None, after: str | None) -> None:
    f = getattr(obj, name)

    async def w(*a: Any, **k: Any) -> Any:
        if before:
            mark(before)
        try:
            return await f(*a, **k)
        finally:
            if after:
                mark(after)

    setattr(obj, name, w)


async def run(a: str, b: str, events: int) -> None:
    global t0
    addr_a, addr_b = free_address(), free_address()
    common = {"logs": [LOG], "retry_delay": 5.0, "update_notifications": True}
    ca = EndpointConfig.from_dict({"location": "A", "dsn": a, "listen": addr_a, **common})
    cb = EndpointConfig.from_dict(
        {"location": "B", "dsn": b, "listen": addr_b, "connections": [{"address": addr_a}], **common}
    )
    async with ReplicationEndpoint(ca) as ea, ReplicationEndpoint(cb) as eb:
        on_notify = ea._on_notify

        def notified(payload: str) -> None:
            mark("A endpoint notified")
            on_notify(payload)

        ea._on_notify = notified  # type: ignore[method-assign]
        ea.journal.backend.slice_queries()  # the LISTEN already holds the bound method: re-listen
        await ea._listening.close()
        ea._listening = await ea.journal.backend.slice_queries().listen(notified, ea._on_reconnect)
        wrap(ea._source, "read", "A read start", "A read end")
        wrap(eb.store, "write_replicated", "B write start", "B write end")
        async with open_journal(a, settings=JournalSettings.load(dsn=a)) as ja:
            await ja.persist(f"{LOG}|warm", [{"x": 0}])
            while await eb.store.progress(LOG, "A") == 0:  # noqa: ASYNC110 (the warm-up)
                await asyncio.sleep(0.01)
            rows = []
            for i in range(events):
                marks.clear()
                before = await eb.store.log_seq_nr(LOG)
                t0 = time.perf_counter()
                await ja.persist(f"{LOG}|lat{i}", [{"lat": i}])
                mark("A persist returned")
                while await eb.store.log_seq_nr(LOG) == before:  # noqa: ASYNC110 (the measurement)
                    await asyncio.sleep(0.001)
                mark("B stored (polled 1 ms)")
                await asyncio.sleep(0.05)
                rows.append({k: v[0] for k, v in marks.items()} | {"B write end": marks["B write end"][0]})
    names = [
        "A persist returned",
        "A endpoint notified",
        "A read start",
        "A read end",
        "B write start",
        "B write end",
        "B stored (polled 1 ms)",
    ]
    for n in names:
        got = sorted(r[n] for r in rows if n in r)
        if got:
            p99 = got[min(len(got) - 1, int(len(got) * 0.99))]
            print(f"{n:<28} p50 {statistics.median(got):6.2f} ms   p99 {p99:6.2f} ms   ({len(got)} events)")


class Steps:
    """At a rate: per step, how many calls, the events per call and the wall time per call."""

    def __init__(self) -> None:
        self.calls: dict[str, list[tuple[float, int]]] = defaultdict(list)

    def wrap(self, obj: Any, name: str, label: str, size: Any) -> None:
        f = getattr(obj, name)

        async def w(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            out = await f(*a, **k)
            self.calls[label].append((time.perf_counter() - t, size(a, out)))
            return out

        setattr(obj, name, w)

    def print(self, seconds: float) -> None:
        for label, got in self.calls.items():
            n = len(got)
            wall = statistics.median(g[0] for g in got) * 1000
            events = sum(g[1] for g in got)
            print(f"{label:<28} {n / seconds:7.0f} calls/s  {events / max(n, 1):6.1f} events/call  "
                  f"wall p50 {wall:5.2f} ms  busy {sum(g[0] for g in got) / seconds:5.0%}")  # fmt: skip


async def at_rate(a: str, b: str, rate: float, seconds: float) -> None:
    """Writes at ``rate`` for ``seconds`` (what is due every 1 ms in one persist_many) and counts
    the steps; the latency to stored at B is measured by the throughput benchmark's loop."""
    addr_a, addr_b = free_address(), free_address()
    common = {"logs": [LOG], "retry_delay": 5.0, "update_notifications": True}
    ca = EndpointConfig.from_dict({"location": "A", "dsn": a, "listen": addr_a, **common})
    cb = EndpointConfig.from_dict(
        {"location": "B", "dsn": b, "listen": addr_b, "connections": [{"address": addr_a}], **common}
    )
    steps = Steps()
    async with ReplicationEndpoint(ca) as ea, ReplicationEndpoint(cb) as eb:
        steps.wrap(ea.store, "stamp", "A stamp", lambda a, out: out)
        steps.wrap(eb.store, "stamp", "B stamp", lambda a, out: out)
        steps.wrap(ea._source, "read", "A read (served)", lambda a, out: len(out.events))
        steps.wrap(eb.store, "target_state", "B target state", lambda a, out: 0)
        steps.wrap(eb.store, "write_replicated", "B write", lambda a, out: len(a[2]))
        async with open_journal(a, settings=JournalSettings.load(dsn=a)) as ja:
            await ja.persist(f"{LOG}|warm", [{"x": 0}])
            while await eb.store.progress(LOG, "A") == 0:  # noqa: ASYNC110 (the warm-up)
                await asyncio.sleep(0.01)
            steps.calls.clear()
            total, done, start = int(rate * seconds), 0, time.perf_counter()
            while done < total:
                due = min(total, int((time.perf_counter() - start) * rate) + 1)
                if due > done:
                    await ja.persist_many([(f"{LOG}|r{k}", [{"k": k}]) for k in range(done, due)])
                    done = due
                await asyncio.sleep(0.001)
            elapsed = time.perf_counter() - start
            while await eb.store.log_seq_nr(LOG) < total + 1:  # noqa: ASYNC110 (drained)
                await asyncio.sleep(0.01)
    print(f"{total} events at {total / elapsed:,.0f}/s")
    steps.print(elapsed)


def main() -> None:
    events = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    with tempfile.TemporaryDirectory() as d:
        server = start_embedded(Path(d) / "pg")
        with scratch_database(server, "lpa") as a, scratch_database(server, "lpb") as b:
            upgrade(a)
            upgrade(b)
            coro = at_rate(a, b, 5000, events / 5000) if "rate" in sys.argv[2:] else run(a, b, events)
            if "uvloop" in sys.argv[2:]:
                from journal import runtime

                runtime.run(coro)
            else:
                asyncio.run(coro)


if __name__ == "__main__":
    main()
