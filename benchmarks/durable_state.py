"""Durable state (issue 34) against raw asyncpg, in the same run, on a fresh database.

(a) ``upsert`` per call: 512 concurrent callers over ``--ids`` pids, one revision of every pid per
    round, against the same callers each sending a raw ``INSERT ... ON CONFLICT DO UPDATE`` of
    one row, on a pool of the same size (target 0.5);
(b) ``upsert_many`` of 1000 parts per call against a raw multi-row ``INSERT ... ON CONFLICT DO
    UPDATE`` (unnest) of the same 1000 rows (target 0.7);
(c) ``current_changes_by_slices`` catch-up over 4 slice ranges of every pid against a raw
    SELECT of the same rows (target 0.6).
Sides alternate round by round, their order rotated; each row reports the median of the
paired rounds' ratios and the load (benchmarks/_common.py).

    flock /tmp/sj-bench.lock python benchmarks/durable_state.py [--ids 10000] [--rounds 5] [--only catch-up|many]

The issue's catch-up figure is of 1M changed pids: ``--ids 1000000 --rounds 5 --only catch-up``.
``--only catch-up`` runs row (c) alone, over rows loaded by a raw COPY (the plugin's row shape,
JSON payloads, 1 µs apart), not through ``upsert``: the upsert rows of 1M pids would take hours.
``--only many`` runs row (b) alone (after the same untimed first revision and ANALYZE).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import msgspec

from journal import DurableState, JournalSettings, open_journal, slice_for, slice_ranges
from journal.postgres.dsn import asyncpg_dsn

try:
    from benchmarks._common import Rounds, alternate_async, fresh_database, header
except ImportError:  # run as a script from benchmarks/
    from _common import Rounds, alternate_async, fresh_database, header  # type: ignore[no-redef]

CALLERS = 512
PER_CALL = 1000
RAW_UPSERT = """
INSERT INTO durable_state (slice, entity_type, persistence_id, revision, db_timestamp, state_ser_id,
                           state_ser_manifest, state_payload)
SELECT s, t, p, r, clock_timestamp(), 1, '', b
  FROM unnest($1::int[], $2::text[], $3::text[], $4::bigint[], $5::bytea[]) AS u(s, t, p, r, b)
ON CONFLICT (persistence_id) DO UPDATE SET revision = EXCLUDED.revision, db_timestamp = EXCLUDED.db_timestamp,
  state_ser_id = EXCLUDED.state_ser_id, state_ser_manifest = EXCLUDED.state_ser_manifest,
  state_payload = EXCLUDED.state_payload
"""


def value(i: int, r: int) -> dict[str, Any]:
    return {"id": i, "revision": r, "items": ["apple", "pear"], "total": i * 10}


async def timed(work: Awaitable[None], n: int) -> float:
    start = time.perf_counter()
    await work
    return n / (time.perf_counter() - start)


async def per_call(store: DurableState, pids: list[str], r: int) -> None:
    queue = iter(enumerate(pids))

    async def caller() -> None:
        for i, pid in queue:
            await store.upsert(pid, r, value(i, r))

    await asyncio.gather(*(caller() for _ in range(CALLERS)))


async def raw_per_call(pool: asyncpg.Pool, pids: list[str], r: int) -> None:
    queue = iter(enumerate(pids))

    async def caller() -> None:
        for i, pid in queue:
            payload = msgspec.json.encode(value(i, r))
            await pool.execute(RAW_UPSERT, [slice_for(pid)], ["Raw"], [pid], [r], [payload])

    await asyncio.gather(*(caller() for _ in range(CALLERS)))


async def many(store: DurableState, pids: list[str], r: int) -> None:
    for k in range(0, len(pids), PER_CALL):
        await store.upsert_many([(p, r, value(k + j, r)) for j, p in enumerate(pids[k : k + PER_CALL])])


async def raw_many(pool: asyncpg.Pool, pids: list[str], r: int) -> None:
    for k in range(0, len(pids), PER_CALL):
        part = pids[k : k + PER_CALL]
        payloads = [msgspec.json.encode(value(k + j, r)) for j in range(len(part))]
        await pool.execute(
            RAW_UPSERT, [slice_for(p) for p in part], ["Raw"] * len(part), part, [r] * len(part), payloads
        )


async def copy_rows(pool: asyncpg.Pool, et: str, ids: int) -> None:
    """``ids`` rows of ``et`` (pids ``et|i``, revision 2, JSON values of :func:`value`) by a raw
    COPY, as the plugin lays them out, stamped 1 µs apart an hour ago (below any horizon)."""
    start, step = datetime.now(UTC) - timedelta(hours=1), timedelta(microseconds=1)
    columns = ["slice", "entity_type", "persistence_id", "revision", "db_timestamp", "state_ser_id",
               "state_ser_manifest", "state_payload"]  # fmt: skip
    for k in range(0, ids, 100_000):
        records = []
        for i in range(k, min(ids, k + 100_000)):
            pid = f"{et}|{i}"
            records.append((slice_for(pid), et, pid, 2, start + i * step, 1, "", msgspec.json.encode(value(i, 2))))
        await pool.copy_records_to_table("durable_state", records=records, columns=columns)


async def catch_up(store: DurableState, et: str) -> int:
    async def one(lo: int, hi: int) -> int:
        return sum([1 async for _ in store.current_changes_by_slices(et, lo, hi)])

    return sum(await asyncio.gather(*(one(lo, hi) for lo, hi in slice_ranges(4))))


async def raw_select(pool: asyncpg.Pool, et: str) -> int:
    rows = await pool.fetch(
        "SELECT persistence_id, revision, db_timestamp, state_ser_id, state_ser_manifest, state_payload "
        "FROM durable_state WHERE entity_type = $1 ORDER BY db_timestamp, revision",
        et,
    )
    return len([msgspec.json.decode(r["state_payload"]) for r in rows])


def main(ids: int, rounds: int, only: str) -> None:
    if only == "catch-up":
        header(f"durable state catch-up: {ids:,} pids a side, loaded by a raw COPY (not upsert), {rounds} rounds")
        with fresh_database() as dsn:
            catch_up_rounds = asyncio.run(measure_catch_up(dsn, ids, rounds))
        catch_up_rounds.report("changes by slices catch-up (4 ranges)", "journal", "raw", target=0.6)
        return
    header(f"durable state: {ids:,} pids, {rounds} rounds, {CALLERS} callers, upsert_many of {PER_CALL}")
    with fresh_database() as dsn:
        rows = asyncio.run(measure(dsn, ids, rounds, only))
    if only == "many":
        rows["many"].report(f"upsert_many ({PER_CALL} per call)", "journal", "raw", target=0.7)
        return
    rows["per call"].report("upsert per call (512 callers)", "journal", "raw", target=0.5)
    rows["many"].report(f"upsert_many ({PER_CALL} per call)", "journal", "raw", target=0.7)
    rows["catch-up"].report("changes by slices catch-up (4 ranges)", "journal", "raw", target=0.6)


async def measure(dsn: str, ids: int, rounds: int, only: str = "all") -> dict[str, Rounds]:
    """Each row's two sides alternate round by round (:func:`alternate_async`); every upsert
    round writes the next revision of every pid of its side (the journal's pids ``State|i``, the
    raw side's ``Raw|i``), after an untimed first one, and the catch-up reads every pid of its side."""
    settings = JournalSettings.load(env={}, dsn=dsn)
    async with open_journal(dsn, settings=settings) as journal:
        store = journal.durable_state()
        size = settings.connection.pool_max_size
        pool = await asyncpg.create_pool(asyncpg_dsn(dsn), min_size=size, max_size=size)
        assert pool is not None
        try:
            mine = [f"State|{i}" for i in range(ids)]
            raw = [f"Raw|{i}" for i in range(ids)]
            # Untimed: each side's first revision (inserts), then ANALYZE, as autovacuum does within a
            # minute or two of a table's first rows. The timed rounds are updates, a service's steady
            # state: a plan the server cached while the table was still empty scans the whole table
            # on each update until the table is analyzed (docs/durable-state.md, "Speed").
            await many(store, mine, 1)
            await raw_many(pool, raw, 1)
            await pool.execute("ANALYZE durable_state")
            revision = {"journal": 1, "raw": 1}

            def next_revision(side: str) -> int:
                revision[side] += 1
                return revision[side]

            many_side = {
                "journal": lambda _: timed(many(store, mine, next_revision("journal")), ids),
                "raw": lambda _: timed(raw_many(pool, raw, next_revision("raw")), ids),
            }
            if only == "many":
                return {"many": await alternate_async(rounds, many_side)}
            per_call_rounds = await alternate_async(rounds, {
                "journal": lambda _: timed(per_call(store, mine, next_revision("journal")), ids),
                "raw": lambda _: timed(raw_per_call(pool, raw, next_revision("raw")), ids),
            })  # fmt: skip
            many_rounds = await alternate_async(rounds, many_side)
            catch_up_rounds = await catch_up_alternating(store, pool, ids, rounds)
        finally:
            await pool.close()
    return {"per call": per_call_rounds, "many": many_rounds, "catch-up": catch_up_rounds}


async def measure_catch_up(dsn: str, ids: int, rounds: int) -> Rounds:
    """Row (c) alone: each side's rows loaded by :func:`copy_rows`, analyzed, then read."""
    settings = JournalSettings.load(env={}, dsn=dsn)
    async with open_journal(dsn, settings=settings) as journal:
        size = settings.connection.pool_max_size
        pool = await asyncpg.create_pool(asyncpg_dsn(dsn), min_size=size, max_size=size)
        assert pool is not None
        try:
            await copy_rows(pool, "State", ids)
            await copy_rows(pool, "Raw", ids)
            await pool.execute("ANALYZE durable_state")
            return await catch_up_alternating(journal.durable_state(), pool, ids, rounds)
        finally:
            await pool.close()


async def catch_up_alternating(store: DurableState, pool: asyncpg.Pool, ids: int, rounds: int) -> Rounds:
    """The journal's catch-up of every ``State`` pid and the raw SELECT of every ``Raw`` one,
    alternating round by round."""

    async def counted(side: str) -> float:
        start = time.perf_counter()
        got = await (catch_up(store, "State") if side == "journal" else raw_select(pool, "Raw"))
        assert got == ids, (side, got, ids)
        return ids / (time.perf_counter() - start)

    return await alternate_async(rounds, {"journal": lambda _: counted("journal"), "raw": lambda _: counted("raw")})


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ids", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", choices=["all", "catch-up", "many"], default="all",
                    help="catch-up: row (c) alone, COPY-loaded; many: row (b) alone")  # fmt: skip
    args = ap.parse_args()
    main(args.ids, args.rounds, args.only)
