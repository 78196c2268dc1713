"""Where a ``persist_many`` call's time goes: the figures behind benchmarks/README.md.

(s) The batch statement (journal/postgres/write_statements.py) of 1000 one-event calls, its
    parameters built beforehand, one statement of each variant in turn on one connection: the
    bare multi-row INSERT of write_throughput.py (the ceiling), the journal's statement with
    ``expected_seq_nr`` given and with every call appending, and the statement without its
    per-call probe of the pid's newest event (its previous highest taken from
    ``expected_seq_nr``). The difference of the last two is the probe.
(l) A lone call's statement (one event, ``expected_seq_nr`` given) and the same without each of
    its server-side parts (NOTIFY, the owner check with the clock, the probe of the pid's
    newest row) beside a bare single-row INSERT, one call of each in turn.
(t) The timeline of ``persist_many`` calls of 1000 parts (median over the calls, from the
    call): columns built (checked and serialized), each statement sent and done, returned.

    flock /tmp/sj-bench.lock python benchmarks/write_breakdown.py [--calls 60] [--lone-calls 3000]
        [--only lone|statements]
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
    from benchmarks.write_throughput import RAW_INSERT, RAW_SINGLE, payload
except ImportError:  # run as a script from benchmarks/
    from _common import fresh_database, header  # type: ignore[no-redef]
    from write_throughput import RAW_INSERT, RAW_SINGLE, payload  # type: ignore[no-redef]

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


async def lone(dsn: str, calls: int) -> None:
    """(l) The lone call's statement (one untagged event, ``expected_seq_nr`` given) part by part:
    each variant is the statement without one of its parts, run call after call for one pid of
    its own on one connection (prepared, autocommit), the variants in turn call by call, so the
    differences are the parts' cost to the server (the client's share is the same driver call)."""
    conn = await asyncpg.connect(dsn)
    writer = str(uuid.uuid4())
    schema = JournalSettings.load(env={}, dsn=dsn).schema
    sql = WriteStatements(Statements(schema), notify=True, bucket_millis=1)
    quiet = WriteStatements(Statements(schema), notify=False, bucket_millis=1)
    validator = WriteValidator(SerializerRegistry())
    pay = payload(3)
    full = sql.statement(validator.batch([("x|1", [pay], 1)]), writer, 0)[0]
    owner = full[full.index("FROM (SELECT CASE") : full.index(") k LEFT JOIN") + len(") k")]
    probe = full[full.index("LEFT JOIN LATERAL (SELECT e.seq_nr") : full.index(") p ON true") + len(") p ON true")]
    no_clock = full.replace(owner, "FROM (SELECT clock_timestamp() AS t, $12::bigint AS epoch) k")
    no_probe = full.replace(
        probe, "LEFT JOIN LATERAL (SELECT $4::bigint AS seq_nr, NULL::timestamptz AS db_timestamp) p ON true"
    )
    quiet_text = quiet.statement(validator.batch([("x|1", [pay], 1)]), writer, 0)[0]
    bare_parts = quiet_text.replace(owner, "FROM (SELECT clock_timestamp() AS t, $12::bigint AS epoch) k").replace(
        probe, "LEFT JOIN LATERAL (SELECT $4::bigint AS seq_nr, NULL::timestamptz AS db_timestamp) p ON true"
    )
    assert len({full, no_clock, no_probe, quiet_text, bare_parts}) == 5
    variants = {
        "bare single-row INSERT": RAW_SINGLE,
        "journal's lone statement": full,
        "without NOTIFY": quiet_text,
        "without the owner check": no_clock,
        "without the probe": no_probe,
        "without all three": bare_parts,
    }
    prepared = {name: await conn.prepare(text) for name, text in variants.items()}
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    backend = f"/proc/{conn.get_server_pid()}/schedstat"  # its CPU time in ns, when the server is local
    names = list(variants)
    for n in range(calls):
        for k in range(len(names)):
            name = names[(n + k) % len(names)]  # the order rotated every call
            pid = f"lone{names.index(name)}|1"
            if name == names[0]:
                args: tuple[Any, ...] = (slice_for(pid), pid, n + 1, orjson.dumps(pay), writer)
            else:
                b = validator.batch([(pid, [pay], n)])
                args = sql.statement(b, writer, 0)[1]
            c0 = _cpu_ns(backend)
            t0 = time.perf_counter()
            await prepared[name].fetch(*args)
            t1 = time.perf_counter()
            if n >= 50:  # plans and caches warm
                times[name].append(t1 - t0)
                cpu[name].append((_cpu_ns(backend) - c0) / 1e9)
    await conn.close()
    bare, bare_cpu = statistics.median(times[names[0]]), statistics.median(cpu[names[0]])
    print(f"(l) a lone call's statement, one pid each, {calls - 50} calls each in turn, µs per call (median):")
    for name, ts in times.items():
        wall, server = statistics.median(ts), statistics.median(cpu[name])
        print(f"    {name:<26} wall {1e6 * wall:7.1f} ({wall / bare:.2f} x bare)"
              f"   server CPU {1e6 * server:6.1f} ({server / bare_cpu:.2f} x bare)")  # fmt: skip


def _cpu_ns(schedstat: str) -> int:
    """A local process's CPU time in ns (/proc/PID/schedstat); 0 when it cannot be read."""
    try:
        with open(schedstat) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


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


async def run(dsn: str, calls: int, lone_calls: int, only: str) -> None:
    header("write_breakdown")
    if only in ("", "lone"):
        await lone(dsn, lone_calls)
    if only in ("", "statements"):
        await statements(dsn, calls)
        await timeline(dsn, calls)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--lone-calls", type=int, default=3000, help="calls of each variant in (l)")
    p.add_argument("--only", choices=("", "lone", "statements"), default="")
    args = p.parse_args()
    with fresh_database() as dsn:
        runtime.run(run(dsn, args.calls, args.lone_calls, args.only))
