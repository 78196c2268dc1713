"""Starting from snapshots vs a full read (issue 36, item 2): events read and seconds, same run.

Fills a fresh database with ``--events`` events over ``--ids`` persistence ids, with a snapshot
every ``--snapshot-every`` events of an id (its latest kept, as the journal keeps it). One id in
``--hot`` (3%) holds most events (about 300 each, so it has snapshots, and ~50 events after its
latest); every other id has one event (no snapshot), so the 1M/100k default is 1,000,000 events
over 100,000 ids. Events are interleaved in time across ids (a pid's in seq_nr order) over an hour
of db_timestamps. Then, in paired rounds whose order is rotated, it reads the whole entity type in
4 slice ranges and folds a read model (a pid's running sum): (full) ``current_events_by_slices``;
(snapshots) ``current_events_by_slices_starting_from_snapshots``. The two models must be equal.

    flock /tmp/sj-bench.lock .venv/bin/python -m benchmarks.from_snapshots [--events 1000000]
        [--ids 100000] [--snapshot-every 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass

import asyncpg

from journal import Journal, JournalSettings, open_journal, slice_for, slice_ranges

try:
    from benchmarks._common import alternate_async, fresh_database, header
except ImportError:  # run as a script from benchmarks/
    from _common import alternate_async, fresh_database, header  # type: ignore[no-redef]

ET = "bench"
HOT = 0.03
FILL = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
  event_ser_manifest, event_payload, writer)
SELECT s, 'bench', p, n, now() - interval '1 hour' + (i * $5::float8) * interval '1 microsecond', 1, '', b, 'w'
FROM unnest($1::int[], $2::text[], $3::bigint[], $4::bytea[], $6::bigint[]) AS t(s, p, n, b, i)"""
SNAPSHOTS = """
INSERT INTO snapshot (slice, entity_type, persistence_id, seq_nr, db_timestamp, write_timestamp, ser_id,
  ser_manifest, snapshot)
SELECT s, 'bench', p, n, now(), 0, 1, '', b
FROM unnest($1::int[], $2::text[], $3::bigint[], $4::bytea[]) AS t(s, p, n, b)"""


def sizes(events: int, ids: int) -> list[int]:
    """Events per id: the hot ids share what the one-event ids leave, about evenly (±50)."""
    hot = max(1, int(ids * HOT))
    left = events - (ids - hot)
    base = left // hot
    out = [max(1, base - 50 + (i * 37) % 101) for i in range(hot)]
    diff = left - sum(out)
    for i in range(abs(diff)):  # spread the rounding over the hot ids
        out[i % hot] += 1 if diff > 0 else -1
    return out + [1] * (ids - hot)


def order(counts: list[int], rng: random.Random) -> list[tuple[int, int]]:
    """Every (id, seq_nr), interleaved at random across ids, each id's in seq_nr order."""
    slots = [i for i, n in enumerate(counts) for _ in range(n)]
    rng.shuffle(slots)
    nxt = [0] * len(counts)
    out = []
    for i in slots:
        nxt[i] += 1
        out.append((i, nxt[i]))
    return out


async def fill(dsn: str, events: int, ids: int, every: int) -> tuple[int, int]:
    """Returns (events, snapshots) written."""
    counts = sizes(events, ids)
    pids = [f"{ET}|{i}" for i in range(ids)]
    slices = [slice_for(p) for p in pids]
    rows = order(counts, random.Random(36))
    conn = await asyncpg.connect(dsn)
    try:
        step = 3_600_000_000 / len(rows)
        batch = 20_000
        for start in range(0, len(rows), batch):
            part = rows[start : start + batch]
            await conn.execute(
                FILL, [slices[i] for i, _ in part], [pids[i] for i, _ in part], [n for _, n in part],
                [json.dumps({"n": n}).encode() for _, n in part], step, list(range(start, start + len(part))),
            )  # fmt: skip
        snaps = [(i, n - n % every) for i, n in enumerate(counts) if every and n >= every]
        for start in range(0, len(snaps), batch):
            part = snaps[start : start + batch]
            await conn.execute(
                SNAPSHOTS, [slices[i] for i, _ in part], [pids[i] for i, _ in part], [s for _, s in part],
                [json.dumps({"sum": s * (s + 1) // 2}).encode() for _, s in part],
            )  # fmt: skip
        await conn.execute("VACUUM ANALYZE event_journal")
        await conn.execute("VACUUM ANALYZE snapshot")
        return len(rows), len(snaps)
    finally:
        await conn.close()


@dataclass
class Read:
    events: int = 0
    snapshots: int = 0
    seconds: float = 0.0
    model: dict[str, int] | None = None


async def read(j: Journal, from_snapshots: bool) -> Read:
    """The whole entity type in 4 slice ranges, folded into a pid -> sum model."""
    out = Read(model={})
    model = out.model
    assert model is not None
    t = time.perf_counter()
    for lo, hi in slice_ranges(4):
        q = (
            j.current_events_by_slices_starting_from_snapshots(ET, lo, hi)
            if from_snapshots
            else j.current_events_by_slices(ET, lo, hi)
        )
        async for e in q:
            if e.source == "snapshot":
                out.snapshots += 1
                model[e.persistence_id] = e.event["sum"]
            else:
                out.events += 1
                model[e.persistence_id] = model.get(e.persistence_id, 0) + e.event["n"]
    out.seconds = time.perf_counter() - t
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--ids", type=int, default=100_000)
    ap.add_argument("--snapshot-every", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    header(f"starting from snapshots: {a.events:,} events, {a.ids:,} ids, a snapshot every {a.snapshot_every}")
    with fresh_database() as dsn:  # made outside the loop (it runs its own)
        asyncio.run(run(dsn, a))


async def run(dsn: str, a: argparse.Namespace) -> None:
    t = time.perf_counter()
    events, snaps = await fill(dsn, a.events, a.ids, a.snapshot_every)
    print(f"filled {events:,} events and {snaps:,} snapshots in {time.perf_counter() - t:.1f} s")
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
        reads: dict[str, list[Read]] = {"full": [], "snapshots": []}

        async def side(name: str) -> float:
            r = await read(j, name == "snapshots")
            reads[name].append(r)
            return 1 / r.seconds

        rounds = await alternate_async(
            a.rounds, {"full": lambda _: side("full"), "snapshots": lambda _: side("snapshots")}
        )
    full, snap = reads["full"][0], reads["snapshots"][0]
    assert full.model == snap.model, "the models differ"
    for name, rs in reads.items():
        secs = statistics.median(r.seconds for r in rs)
        print(f"{name:<10} events read {rs[0].events:>10,}  snapshots {rs[0].snapshots:>7,}  "
              f"median {secs:6.2f} s  (rounds {' '.join(f'{r.seconds:.2f}' for r in rs)})")  # fmt: skip
    ratios = " ".join(f"{r:.2f}" for r in rounds.ratios("snapshots", "full"))
    speed = rounds.ratio("snapshots", "full")
    print(f"from snapshots / full: {snap.events / full.events:.3f} of the events read; "
          f"{speed:.2f} x as fast (paired rounds: {ratios}); {rounds.load()}")  # fmt: skip


if __name__ == "__main__":
    main()
