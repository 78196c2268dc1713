"""Members of a job that start at the same instant: the first lease round already splits the
slices into one contiguous range per member (no interleaved single-slice ranges)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import asyncpg

from journal import Journal
from journal.ids import NUMBER_OF_SLICES, runs
from journal.postgres.leases import PostgresSliceLeases


async def _nothing(_slices: set[int]) -> None:
    return None


async def _start(member: PostgresSliceLeases) -> Mapping[int, int]:
    await member.join()
    return await member.rebalance(_nothing)


async def test_members_starting_at_once_each_hold_one_contiguous_range_after_the_first_round(
    journal: Journal, dsn: str
) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=4, max_size=4)
    try:
        for trial in range(25):
            name = f"start-at-once-{trial}"
            a, b = (PostgresSliceLeases(lambda: pool, "public", name, owner, ttl=30) for owner in ("m-a", "m-b"))
            held_a, held_b = await asyncio.gather(_start(a), _start(b))
            ranges = {"m-a": runs(set(held_a)), "m-b": runs(set(held_b))}
            assert set(held_a).isdisjoint(held_b), (trial, ranges)
            assert len(ranges["m-a"]) <= 1 and len(ranges["m-b"]) <= 1, (trial, ranges)
            assert set(held_a) | set(held_b) == set(range(NUMBER_OF_SLICES)), (trial, ranges)
    finally:
        await pool.close()
