"""What the replication indexes cost a journal that never replicates (issue 14).

Three databases on one server, migrated to head, differing only in the index on the log
position and origin: ``head`` (as migrated: both partial, migration 0006), ``full`` (migration
0005's ``(entity_type, log_seq_nr)`` index on every row) and ``none`` (neither, the ceiling).
Each round writes the same rows to each, in turn:
(a) the journal's group commit, many entities concurrently, one event per call
    (``write_throughput.py`` (a));
(r) the raw multi-row INSERT of ``write_throughput.py`` (1000 rows per statement).
The order of the variants rotates from round to round; the best round of each is reported,
as rows/s and as a ratio to ``none``.

    flock /tmp/sj-bench.lock python benchmarks/log_index_cost.py [--events 50000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import asyncpg

from journal import JournalSettings, open_journal, runtime
from journal.postgres.dsn import asyncpg_dsn

try:
    from benchmarks._common import fresh_databases, header
    from benchmarks.write_throughput import payload, raw_batched
except ImportError:  # run as a script from benchmarks/
    from _common import fresh_databases, header  # type: ignore[no-redef]
    from write_throughput import payload, raw_batched  # type: ignore[no-redef]

VARIANTS = {
    "head": [],
    "full": [
        "DROP INDEX IF EXISTS event_journal_log_idx",
        "DROP INDEX IF EXISTS event_journal_origin_idx",
        "CREATE INDEX event_journal_log_full_idx ON event_journal (entity_type, log_seq_nr)",
    ],
    "none": ["DROP INDEX IF EXISTS event_journal_log_idx", "DROP INDEX IF EXISTS event_journal_origin_idx"],
}


async def prepare(dsn: str, statements: list[str]) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        for sql in statements:
            await conn.execute(sql)
    finally:
        await conn.close()


async def journal_concurrent(dsn: str, entities: int, per_entity: int, prefix: str) -> float:
    """``write_throughput.py`` (a) with its own pids per round."""
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:

        async def entity(e: int) -> None:
            for n in range(per_entity):
                await j.persist(f"{prefix}|{e}", [payload(n)], expected_seq_nr=n)

        start = time.perf_counter()
        await asyncio.gather(*(entity(e) for e in range(entities)))
        return entities * per_entity / (time.perf_counter() - start)


async def run(dsns: dict[str, str], args: argparse.Namespace) -> None:
    header("log_index_cost: writes with the replication index variants")
    for name, dsn in dsns.items():
        await prepare(dsn, VARIANTS[name])
    per_entity = max(1, args.events // args.entities)
    best: dict[tuple[str, str], float] = {}
    names = list(dsns)
    for k in range(args.rounds):  # the order rotates: no variant always runs first (or last)
        for name in names[k % len(names) :] + names[: k % len(names)]:
            dsn = dsns[name]
            ours = await journal_concurrent(dsn, args.entities, per_entity, prefix=f"r{k}")
            raw = await raw_batched(dsn, args.entities, per_entity, f"raw{k}")
            best[("a", name)] = max(best.get(("a", name), 0.0), ours)
            best[("r", name)] = max(best.get(("r", name), 0.0), raw)
    for kind, title in (("a", "(a) journal, 1 event per call"), ("r", "(r) raw multi-row INSERT")):
        ceiling = best[(kind, "none")]
        for name in dsns:
            v = best[(kind, name)]
            print(f"{title:<34} {name:<5} {v:>10,.0f} rows/s   ratio to no index {v / ceiling:.2f}")
    print(f"    best of {args.rounds} rounds of {args.entities * per_entity} rows per variant")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=50_000)
    p.add_argument("--entities", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    with fresh_databases(list(VARIANTS)) as dsns:
        runtime.run(run(dsns, args))


if __name__ == "__main__":
    main()
