"""Where a ``persist_many`` call's time goes: the figures behind benchmarks/README.md.

(s) The batch statement (journal/postgres/write_statements.py) of 1000 one-event calls, its
    parameters built beforehand, one statement of each variant in turn on one connection: the
    bare multi-row INSERT of write_throughput.py (the ceiling), the journal's statement with
    ``expected_seq_nr`` given and with every call appending, and the statement without its
    per-call probe of the pid's newest event (its previous highest taken from
    ``expected_seq_nr``). The difference of the last two is the probe.
(t) The timeline of ``persist_many`` calls of 1000 parts (median over the calls, from the
    call): columns built (checked and serialized), each statement sent and done, returned.

    flock /tmp/sj-bench.lock python benchmarks/write_breakdown.py [--calls 60]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import orjson

from journal import JournalSettings, Write, open_journal, runtime, slice_for
from journal.postgres.statements import Statements
from journal.postgres.write_statements import WriteStatements
from journal.serialization import SerializerRegistry
from journal.write_validation import WriteValidator

try:
    from benchmarks._common import fresh_database, header
    from benchmarks.write_throughput import RAW_INSERT, payload
except ImportError:  # run as a script from benchmarks/
    from _common import fresh_database, header  # type: ignore[no-redef]
    from write_throughput import RAW_INSERT, payload  # type: ignore[no-redef]

N = 1000


async def statements(dsn: str, calls: int) -> None:
    conn = await asyncpg.connect(dsn)
    writer = str(uuid.uuid4())
    sql = WriteStatements(Statements(JournalSettings.load(env={}, dsn=dsn).schema), notify=True, bucket_millis=1)
    validator = WriteValidator(SerializerRegistry())
    pay = payload(3)

    def without_probe(text: str) -> str:
        start = text.index("LEFT JOIN LATERAL (SELECT e.seq_nr")
        end = text.index(") h ON true", start)
        no_probe = "LEFT JOIN LATERAL (SELECT c.expected AS seq_nr, NULL::timestamptz AS db_timestamp"
        return text[:start] + no_probe + text[end:]

    def journal(expected: bool, probe: bool = True) -> Callable[[str, int], tuple[Any, ...]]:
        def args(prefix: str, n: int) -> tuple[Any, ...]:
            parts = [(f"{prefix}|{e}", [pay], n if expected else None) for e in range(N)]
            text, params = sql.statement(validator.batch(parts), writer, 0)
            return (text if probe else without_probe(text), *params)

        return args

    def raw(prefix: str, n: int) -> tuple[Any, ...]:
        pids = [f"{prefix}|{e}" for e in range(N)]
        return (RAW_INSERT, [slice_for(p) for p in pids], pids, [n + 1] * N, [orjson.dumps(pay)] * N, writer)

    variants = {
        "bare INSERT (ceiling)": raw,
        "journal, expected_seq_nr": journal(True),
        "journal, appending": journal(False),
        "without the probe": journal(True, probe=False),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for n in range(calls):
        for k, (name, args) in enumerate(variants.items()):
            params = args(f"s{k}", n)
            t0 = time.perf_counter()
            await conn.fetch(*params)
            if n >= 5:  # plans and caches warm
                times[name].append(time.perf_counter() - t0)
    await conn.close()
    print(f"(s) one statement of {N} rows, parameters built beforehand (median of {calls - 5}):")
    for name, ts in times.items():
        print(f"    {name:<24} {1e3 * statistics.median(ts):6.2f} ms")


async def timeline(dsn: str, calls: int) -> None:
    marks: list[tuple[str, float]] = []
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
        backend: Any = j.backend
        send = backend._send

        async def timed_send(*args: Any) -> Any:
            marks.append(("a statement started", time.perf_counter()))
            got = await send(*args)
            marks.append(("a statement done", time.perf_counter()))
            return got

        backend._send = timed_send
        await j.persist_many([Write(f"warm|{e}", [payload(e)], 0) for e in range(N)])
        rows: dict[tuple[int, str], list[float]] = {}
        for n in range(calls):
            parts = [Write(f"t|{e}", [payload(n)], n) for e in range(N)]
            marks.clear()
            t0 = time.perf_counter()
            await j.persist_many(parts)
            marks.append(("returned", time.perf_counter()))
            for i, (what, t) in enumerate(sorted(marks, key=lambda m: m[1])):
                rows.setdefault((i, what), []).append(1e3 * (t - t0))
    print(f"(t) persist_many of {N} parts, ms from the call (median of {calls}):")
    for (_, what), ts in sorted(rows.items()):
        print(f"    {statistics.median(ts):6.2f}  {what}")


async def run(dsn: str, calls: int) -> None:
    header("write_breakdown")
    await statements(dsn, calls)
    await timeline(dsn, calls)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=60)
    args = p.parse_args()
    with fresh_database() as dsn:
        runtime.run(run(dsn, args.calls))
