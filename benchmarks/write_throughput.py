"""Write throughput: the journal's group commit vs raw asyncpg, measured in the same run.

Two modes, both printed, each against the raw multi-row INSERT measured in the same run:

default: how most users first write: a plain ``asyncio.run`` (the standard event loop), the
    garbage collector untouched, no ``expected_seq_nr``.
    (A) 512 concurrent callers over 4,000 pids, ``persist(pid, [event])``;
    (C) ``persist_many`` of plain ``(pid, events)`` tuples, 1000 pids per call.
tuned: under journal.runtime.run (uvloop, the collector tuned), ``expected_seq_nr`` passed.
Each row runs its sides round by round, their order rotated every round, and reports the median of
the rounds' ratios with the load average (benchmarks._common.alternate).
(a) many entities persisting concurrently (one event per call, expected_seq_nr known) vs a raw
    multi-row INSERT (unnest, 1000 rows per statement) of the same rows;
(b) one entity persisting one event at a time vs a raw single-row autocommit INSERT;
(c) persist_many: the same rows as (a), 1000 pids per call (one event each, expected_seq_nr
    known) vs the same raw multi-row INSERT.

    python benchmarks/write_throughput.py [--events 200000] [--entities 1000] [--single 3000]
        [--mode both|default|tuned] [--asyncio] [--no-gc-tuning]

Each mode runs in its own process (the default one first), both sides of it in that process:
the tuned one under journal.runtime.run, on uvloop and with the garbage collector tuned
(journal.runtime.tune_gc) unless ``--asyncio`` / ``--no-gc-tuning`` say otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import asyncpg
import orjson

from journal import JournalSettings, Write, failures, open_journal, runtime, slice_for

try:
    from benchmarks._common import Rounds, alternate_async, fresh_database, header
except ImportError:  # run as a script from benchmarks/
    from _common import Rounds, alternate_async, fresh_database, header  # type: ignore[no-redef]

RAW_BATCH = 1000
RAW_INSERT = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
  event_ser_manifest, event_payload, writer)
SELECT s, 'bench', p, n, now(), 1, '', b, $5
FROM unnest($1::int[], $2::text[], $3::bigint[], $4::bytea[]) AS t(s, p, n, b)"""
RAW_SINGLE = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
  event_ser_manifest, event_payload, writer) VALUES ($1, 'bench', $2, $3, now(), 1, '', $4, $5)"""


def payload(i: int) -> dict[str, object]:
    return {"item": f"sku-{i % 977}", "qty": i % 7 + 1, "price": 1999}


async def raw_batched(dsn: str, entities: int, per_entity: int, prefix: str = "raw") -> float:
    conn = await asyncpg.connect(dsn)
    writer = str(uuid.uuid4())
    rows = [
        (slice_for(f"{prefix}|{e}"), f"{prefix}|{e}", n, json.dumps(payload(n)).encode())
        for n in range(1, per_entity + 1)
        for e in range(entities)
    ]
    start = time.perf_counter()
    for i in range(0, len(rows), RAW_BATCH):
        chunk = rows[i : i + RAW_BATCH]
        await conn.execute(RAW_INSERT, *(list(c) for c in zip(*chunk, strict=True)), writer)
    elapsed = time.perf_counter() - start
    await conn.close()
    return len(rows) / elapsed


async def journal_concurrent(
    dsn: str, entities: int, per_entity: int, per_call: int = 1, prefix: str = "bench"
) -> tuple[float, int]:
    settings = JournalSettings.load(env={}, dsn=dsn)
    async with open_journal(dsn, settings=settings) as j:

        async def entity(e: int) -> None:
            pid = f"{prefix}{per_call}|{e}"
            for n in range(0, per_entity, per_call):
                await j.persist(pid, [payload(n + k) for k in range(per_call)], expected_seq_nr=n)

        start = time.perf_counter()
        await asyncio.gather(*(entity(e) for e in range(entities)))
        elapsed = time.perf_counter() - start
        return entities * per_entity / elapsed, j._group_commit.batches_written


ORDERS = list(itertools.permutations(("raw", "values", "bulk")))


class Interleaved:
    """(c), one call at a time in turn: the raw INSERT of rows built up front, the raw INSERT
    of rows built and serialized in the timed section, and ``persist_many`` of the same number
    of parts (built in its timed section, as a caller does). Call by call, the six orders of the
    three in turn (a side called right after raw code pays ~0.3 ms per 1000 rows more: rotating
    three orders put "values" after raw in two calls of three, "bulk" in one), so the table's
    growth, the caches and the shared machine's load weigh on all three alike;
    ``rounds`` blocks of calls, each a paired round (:class:`Rounds`) whose rates are its sums."""

    def __init__(self, parts: Callable[[int, int], list[Any]] | None = None, prefix: str = "") -> None:
        self.prefix = prefix
        self.parts = parts or (lambda pids, n: [Write(f"bulk|{e}", [payload(n)], n) for e in range(pids)])
        self.seconds = {"raw": 0.0, "values": 0.0, "bulk": 0.0}
        self.client = dict.fromkeys(self.seconds, 0.0)
        self.rows = 0
        self.rounds = Rounds({what: [] for what in self.seconds})

    async def run(self, dsn: str, pids: int, calls: int, rounds: int = 3) -> Rounds:
        settings = JournalSettings.load(env={}, dsn=dsn)
        conn = await asyncpg.connect(dsn)
        writer = str(uuid.uuid4())
        async with open_journal(dsn, settings=settings) as j:
            await j.persist_many([Write(f"warm{self.prefix}|{e}", [payload(e)]) for e in range(pids)])
            per_round = max(1, calls // rounds)
            for k in range(rounds):
                self.rounds.loads.append(os.getloadavg()[0])
                seconds = dict.fromkeys(self.seconds, 0.0)
                for n in range(k * per_round, (k + 1) * per_round):
                    names = [f"rawc{self.prefix}|{e}" for e in range(pids)]
                    rows = ([slice_for(p) for p in names], names, [n + 1] * pids,
                            [json.dumps(payload(n)).encode()] * pids)  # fmt: skip
                    sides: dict[str, Callable[[], Awaitable[Any]]] = {
                        "raw": partial(conn.execute, RAW_INSERT, *rows, writer),  # rows built beforehand
                        "values": partial(self._values, conn, writer, pids, n),
                        "bulk": partial(self._bulk, j, pids, n),
                    }
                    for what in ORDERS[n % len(ORDERS)]:
                        seconds[what] += await self._timed(what, sides[what])
                self.rows += pids * per_round
                for what, t in seconds.items():
                    self.rounds.rates[what].append(pids * per_round / t)
        await conn.close()
        return self.rounds

    async def _values(self, conn: asyncpg.Connection, writer: str, pids: int, n: int) -> None:
        names = [f"rawv{self.prefix}|{e}" for e in range(pids)]
        await conn.execute(
            RAW_INSERT, [slice_for(p) for p in names], names, [n + 1] * pids,
            [orjson.dumps(payload(n)) for _ in names], writer,
        )  # fmt: skip

    async def _bulk(self, j: Any, pids: int, n: int) -> None:
        out = await j.persist_many(self.parts(pids, n))
        assert not failures(out), failures(out)[:3]

    async def _timed(self, what: str, call: Callable[[], Awaitable[Any]]) -> float:
        c0, t0 = time.process_time(), time.perf_counter()
        await call()
        elapsed = time.perf_counter() - t0
        self.seconds[what] += elapsed
        self.client[what] += time.process_time() - c0
        return elapsed

    def rate(self, what: str) -> float:
        return self.rounds.median(what)

    def client_ms_per_1000(self, what: str) -> float:
        return 1e6 * self.client[what] / self.rows

    def client_line(self, parts: str) -> str:
        """The client CPU per 1000 rows of each side, and persist_many's against raw code building,
        serializing and inserting the same rows (issue 37 item 3: goal <= 1.5 x)."""
        raw, values, bulk = (self.client_ms_per_1000(w) for w in ("raw", "values", "bulk"))
        return (
            f"    client CPU per 1000 rows: raw {raw:.2f} ms, raw from values {values:.2f} ms, persist_many"
            f" {bulk:.2f} ms ({parts}): {bulk / values:.2f} x raw from values (goal <= 1.5 x)"
        )


async def raw_single(dsn: str, n: int, pid: str = "rawone|1") -> float:
    conn = await asyncpg.connect(dsn)
    writer = str(uuid.uuid4())
    sl = slice_for(pid)
    stmt = await conn.prepare(RAW_SINGLE)
    start = time.perf_counter()
    for i in range(1, n + 1):
        await stmt.fetch(sl, pid, i, json.dumps(payload(i)).encode(), writer)
    elapsed = time.perf_counter() - start
    await conn.close()
    return n / elapsed


async def journal_single(dsn: str, n: int, pid: str = "one|1") -> float:
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
        # its write connection and statement before the clock, as raw_single connects and prepares
        # before its own (the first call's connection and statement cost 17-21 ms: 4-5 % of a round)
        await j.persist(f"{pid}-warm", [payload(0)], expected_seq_nr=0)
        start = time.perf_counter()
        for i in range(n):
            await j.persist(pid, [payload(i)], expected_seq_nr=i)
        return n / (time.perf_counter() - start)


DEFAULT_CALLERS = 512
DEFAULT_PIDS = 4000


async def journal_default(dsn: str, events: int, prefix: str) -> float:
    """(A): ``DEFAULT_CALLERS`` callers, each writing one event per call, no expected_seq_nr,
    round-robin over its share of ``DEFAULT_PIDS`` pids."""
    per_caller = max(1, events // DEFAULT_CALLERS)
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:

        async def caller(c: int) -> None:
            pids = [f"{prefix}|{p}" for p in range(c, DEFAULT_PIDS, DEFAULT_CALLERS)]
            for n in range(per_caller):
                await j.persist(pids[n % len(pids)], [payload(n)])

        start = time.perf_counter()
        await asyncio.gather(*(caller(c) for c in range(DEFAULT_CALLERS)))
        return DEFAULT_CALLERS * per_caller / (time.perf_counter() - start)


async def run_default(dsn: str, args: argparse.Namespace) -> None:
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    header(f"write_throughput, default mode (event loop {loop}; gc untouched, threshold {gc.get_threshold()[0]})")
    await raw_single(dsn, 200, "warmD|raw")
    await journal_single(dsn, 200, "warmD|journal")
    rounds = args.rounds
    per_round = max(DEFAULT_CALLERS, args.events // rounds)
    a = await alternate_async(rounds, {
        "raw": lambda k: raw_batched(dsn, DEFAULT_PIDS, max(1, per_round // DEFAULT_PIDS), f"rawA{k}"),
        "journal": lambda k: journal_default(dsn, per_round, f"A{k}"),
    })  # fmt: skip
    a.report(f"(A) default: {DEFAULT_CALLERS} callers, {DEFAULT_PIDS} pids", "journal", "raw", "ev/s", target=0.5)
    print(f"    rounds of {per_round} events; no expected_seq_nr")
    pids = min(args.entities, RAW_BATCH)
    c = Interleaved(lambda pids, n: [(f"bulkd|{e}", [payload(n)]) for e in range(pids)], prefix="D")
    cr = await c.run(dsn, pids, max(1, args.events // pids), rounds)
    cr.report(f"(C) default: persist_many of (pid, events), {pids}", "bulk", "raw", target=0.8)
    print(
        f"    {c.rows} rows each, one call of each in turn; like for like: raw {c.rate('values'):,.0f} rows/s,"
        f" ratio {cr.ratio('bulk', 'values'):.2f}"
    )
    print(c.client_line("of plain tuples"))


async def run(dsn: str, args: argparse.Namespace) -> None:
    per_entity = max(1, args.events // args.entities)
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    tuned = "off" if args.no_gc_tuning else f"startup heap frozen, gen0 threshold {gc.get_threshold()[0]}"
    header(f"write_throughput (both sides in one process: event loop {loop}; gc tuning {tuned})")
    # warm up both paths (connections, plans, caches)
    await raw_single(dsn, 200, "warm|raw")
    await journal_single(dsn, 200, "warm|journal")
    # the machine's load swings: each row's sides alternate round by round, median of the pairs
    rounds = args.rounds
    per_round = max(1, per_entity // rounds)
    per_round5 = max(5, per_round - per_round % 5)
    batches: list[int] = []

    async def concurrent(k: int, per_call: int, per: int) -> float:
        rate, b = await journal_concurrent(dsn, args.entities, per, per_call, prefix=f"a{per_call}-{k}-")
        batches.append(b)
        return rate

    a = await alternate_async(rounds, {
        "raw": lambda k: raw_batched(dsn, args.entities, per_round, f"rawa{k}"),
        "journal": lambda k: concurrent(k, 1, per_round),
    })  # fmt: skip
    a.report(f"(a) {args.entities} entities concurrently", "journal", "raw", "ev/s", target=0.6)
    print(f"    rounds of {args.entities * per_round} events, one per call, in {sum(batches)} group-commit batches")
    a5 = await alternate_async(rounds, {
        "raw": lambda k: raw_batched(dsn, args.entities, per_round5, f"rawa5{k}"),
        "journal": lambda k: concurrent(k, 5, per_round5),
    })  # fmt: skip
    a5.report(f"(a') {args.entities} entities, 5 events per call", "journal", "raw", "ev/s", target=0.95)
    pids = min(args.entities, RAW_BATCH)
    c = Interleaved()
    cr = await c.run(dsn, pids, max(1, args.events // pids), rounds)
    cr.report(f"(c) persist_many, {pids} pids per call", "bulk", "raw", target=0.9)
    print(
        f"    {c.rows} rows each, one statement (or call) of each in turn; like for like (raw also builds and"
        f" serializes its rows in the timed section): raw {c.rate('values'):,.0f} rows/s,"
        f" ratio {cr.ratio('bulk', 'values'):.2f}"
    )
    print(c.client_line("including building its Write parts"))
    single = max(1, args.single // rounds)
    b = await alternate_async(rounds, {
        "raw": lambda k: raw_single(dsn, single, f"rawone|{k}"),
        "journal": lambda k: journal_single(dsn, single, f"one|{k}"),
    })  # fmt: skip
    b.report("(b) one entity, one event per call", "journal", "raw", "ev/s", target=0.75)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--entities", type=int, default=1000)
    p.add_argument("--single", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3, help="paired rounds per row (each side once per round)")
    p.add_argument("--asyncio", action="store_true", help="the standard event loop instead of uvloop (both sides)")
    p.add_argument("--no-gc-tuning", action="store_true", help="without journal.runtime.tune_gc (both sides)")
    p.add_argument("--mode", choices=("both", "default", "tuned"), default="both")
    p.add_argument("--dsn", help=argparse.SUPPRESS)  # the database of a mode run in a child process
    args = p.parse_args()
    if args.mode == "both":
        with fresh_database() as dsn:
            for mode in ("default", "tuned"):  # each mode in a fresh process: its own loop and collector
                argv = [a for a in sys.argv[1:] if not a.startswith("--mode")]
                subprocess.run([sys.executable, "-m", "benchmarks.write_throughput", *argv, "--mode", mode,
                                "--dsn", dsn], check=True)  # fmt: skip
    else:
        with contextlib.nullcontext(args.dsn) if args.dsn else fresh_database() as dsn:
            if args.mode == "default":
                asyncio.run(run_default(dsn, args))
            else:
                runtime.run(run(dsn, args), uvloop=not args.asyncio, gc_tuning=not args.no_gc_tuning)
