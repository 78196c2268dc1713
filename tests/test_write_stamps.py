"""The timestamp rule on every write path: rows of one statement one microsecond apart, each
pid's stamps increasing, what a write returns equal to what is stored, the clock past a write's
rows when it returns, and a horizon-mode live query that reads all of it once, in order.

Before the rule stamped rows apart, a group-commit batch (up to 2,000 rows) or one call (up to
10,000 events) shared one timestamp, which a reader paging 1,000 rows by timestamp (the Akka
plugin, ``tests/test_jvm_interop.py``) cannot get past."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

from journal import EventEnvelope, Journal, Write, Written, failures
from journal.envelope import ROW_STEP
from journal.write_validation import MAX_EVENTS_PER_CALL
from tests.support.waiting import wait_until

T = "Stamp"


async def _stored(conn: asyncpg.Connection) -> dict[tuple[str, int], datetime]:
    rows = await conn.fetch("SELECT persistence_id, seq_nr, db_timestamp FROM event_journal WHERE entity_type = $1", T)
    return {(r[0], r[1]): r[2] for r in rows}


def _returned(envelopes: Sequence[Sequence[EventEnvelope]]) -> dict[tuple[str, int], datetime]:
    return {(e.persistence_id, e.seq_nr): e.db_timestamp for envs in envelopes for e in envs}


def _written(outcomes: Sequence[Any], counts: Sequence[int]) -> dict[tuple[str, int], datetime]:
    assert failures(outcomes) == []
    out: dict[tuple[str, int], datetime] = {}
    for o, n in zip(outcomes, counts, strict=True):
        assert isinstance(o, Written)
        for i in range(n):
            out[(o.persistence_id, o.first_seq_nr + i)] = o.db_timestamp + i * ROW_STEP
    return out


async def test_every_write_path_stamps_rows_apart_and_a_horizon_query_reads_them_once(
    journal: Journal, dsn: str
) -> None:
    conn = await asyncpg.connect(dsn)
    delivered: list[EventEnvelope] = []

    async def consume() -> None:
        async for e in journal.events_by_slices(T, 0, 1023):  # horizon mode, the default
            delivered.append(e)

    reader = asyncio.ensure_future(consume())
    returned: dict[tuple[str, int], datetime] = {}
    try:
        # (i) a burst of concurrent single-event calls: group-commit batches, general insert
        returned |= _returned(await asyncio.gather(*(journal.persist(f"{T}|b{i}", [i]) for i in range(1500))))
        # the same with expected_seq_nr: the optimistic (known-sequence) insert
        known = [journal.persist(f"{T}|b{i}", [i], expected_seq_nr=1) for i in range(1500)]
        returned |= _returned(await asyncio.gather(*known))
        # (ii) persist_many of thousands of parts: the column path, then calls of several events
        out = await journal.persist_many([(f"{T}|m{i}", [i], 0) for i in range(3000)])
        returned |= _written(out, [1] * 3000)
        out = await journal.persist_many([Write(f"{T}|n{i}", [1, 2, 3, 4]) for i in range(600)])
        returned |= _written(out, [4] * 600)
        # (iii) one call of the largest allowed size
        big = await journal.persist(f"{T}|big", list(range(MAX_EVENTS_PER_CALL)))
        clock_after = await conn.fetchval("SELECT clock_timestamp()")
        assert clock_after > big[-1].db_timestamp, "the write settled: the clock passed its rows"
        returned |= _returned([big])
        # persist_in, inside the caller's transaction
        async with conn.transaction():
            returned |= _returned([await journal.persist_in(conn, f"{T}|in", list(range(50)))])
        stored = await _stored(conn)
        assert stored == returned, "every write returned the timestamps stored"
        per_stamp = await conn.fetchval(
            "SELECT max(n) FROM (SELECT count(*) AS n FROM event_journal GROUP BY db_timestamp) c"
        )
        bound = journal.settings.write.max_in_flight + journal.settings.write.bulk_in_flight
        assert per_stamp <= bound, f"{per_stamp} rows share a timestamp (one per statement in flight at most)"
        by_pid: dict[str, list[tuple[int, datetime]]] = {}
        for (pid, seq), ts in sorted(stored.items()):
            by_pid.setdefault(pid, []).append((seq, ts))
        for pid, rows in by_pid.items():
            stamps = [ts for _, ts in rows]
            assert stamps == sorted(set(stamps)), f"{pid}: stamps increase with seq_nr"
        await wait_until(lambda: len(delivered) >= len(stored), 120, "the live query to read every event")
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await conn.close()
    keys = [(e.persistence_id, e.seq_nr) for e in delivered]
    assert len(keys) == len(set(keys)) == len(stored), "each event once"
    order = [(e.db_timestamp, e.seq_nr, e.persistence_id) for e in delivered]
    assert order == sorted(order), "in offset order: nothing landed below the horizon it passed"
