"""The TagStore contract: the same tests over the PostgreSQL and the Cassandra tag stores (real
servers), so the events-by-tag algorithms (writer, query, recovery) can rely on one behaviour."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tag_backends import TagBackend, open_tag_backend

from journal import ConfigurationError
from journal.backend import TagProgress, TagRow, row_of
from journal.buckets import bucket_of, bucket_of_millis
from journal.serialization import Serialized
from journal.timeuuid import GREGORIAN_OFFSET, sort_key, ticks, timeuuid_for_event

FAR = (1 << 60) - 1
"""A ``before_ticks`` above every real row."""


@pytest.fixture
async def tb(journal_target: str, target_session: Any) -> AsyncIterator[TagBackend]:
    async with open_tag_backend(journal_target, target_session) as b:
        yield b


def row(pid: str, n: int, ts: datetime, tag: str = "c", meta: Serialized | None = None) -> TagRow:
    u = timeuuid_for_event(ts, pid, n)
    return TagRow(tag, bucket_of(u, "Hour"), u, pid, n, n + 100, f"w-{pid}", Serialized(7, "m", b"%d" % n), meta)


def hour_start(ts: datetime) -> datetime:
    return ts.replace(minute=0, second=0, microsecond=0)


async def read_all(tb: TagBackend, tag: str, bucket: int, limit: int = 1000) -> list[TagRow]:
    return [row_of(r) for r in await tb.store.read_tag_rows(tag, bucket, None, FAR, limit)]


async def test_rows_round_trip_in_timeuuid_order_and_upsert_is_idempotent(tb: TagBackend) -> None:
    base = hour_start(datetime.now(UTC)) + timedelta(minutes=1)
    meta = Serialized(9, "meta", b"{}")
    rows = [row(f"P|{i % 3}", i // 3 + 1, base + timedelta(milliseconds=i * 7), meta=meta if i == 4 else None)
            for i in range(12)]  # fmt: skip
    shuffled = random.sample(rows, len(rows))
    await tb.store.write_tag_rows(shuffled[:6])
    await tb.store.write_tag_rows(shuffled[6:])
    await tb.store.write_tag_rows(rows)  # a resend (recovery): the same keys, nothing doubles
    got = await read_all(tb, "c", rows[0].timebucket)
    assert got == sorted(rows, key=lambda r: sort_key(r.timeuuid))
    assert got[4].meta == meta and got[0].meta is None
    assert got[0].event == Serialized(7, "m", b"1") and got[0].writer == "w-P|0" and got[0].seq_nr == 101
    assert len(await tb.raw.tag_rows()) == 12


async def test_bounds_are_exclusive_and_pages_chain(tb: TagBackend) -> None:
    start = hour_start(datetime.now(UTC))
    bucket = bucket_of_millis(int(start.timestamp() * 1000), "Hour")
    first = row("B|1", 1, start)  # exactly at the bucket's first microsecond: inside the bucket
    same_time = [row(f"B|{k}", 1, start + timedelta(seconds=5)) for k in range(2, 6)]  # one microsecond
    late = row("B|1", 2, start + timedelta(seconds=9))
    other_tag = row("B|1", 1, start + timedelta(seconds=6), tag="other")
    other_bucket = row("B|1", 3, start + timedelta(hours=1, seconds=1))
    await tb.store.write_tag_rows([first, *same_time, late])
    await tb.store.write_tag_rows([other_tag])
    await tb.store.write_tag_rows([other_bucket])
    everything = await read_all(tb, "c", bucket)
    assert {r.persistence_id for r in everything[1:5]} == {f"B|{k}" for k in range(2, 6)}
    assert everything[0] == first and everything[-1] == late and len(everything) == 6
    # page by page with limit 1, each page after the last row of the previous: the same rows
    chained: list[TagRow] = []
    after: uuid.UUID | None = None
    while page := await tb.store.read_tag_rows("c", bucket, after, FAR, 1):
        chained.append(row_of(page[0]))
        after = chained[-1].timeuuid
    assert chained == everything
    # before_ticks is exclusive: a bound at a row's own time excludes it and keeps earlier rows
    before_late = await tb.store.read_tag_rows("c", bucket, None, ticks(late.timeuuid), 100)
    assert [row_of(r) for r in before_late] == everything[:-1]
    at_start = (int(start.timestamp() * 1000) * 10_000) + GREGORIAN_OFFSET
    assert await tb.store.read_tag_rows("c", bucket, None, at_start, 100) == []
    assert [row_of(r) for r in await tb.store.read_tag_rows("c", bucket, None, FAR, 3)] == everything[:3]
    assert await read_all(tb, "other", bucket) == [other_tag]
    assert await read_all(tb, "c", other_bucket.timebucket) == [other_bucket]


async def test_next_bucket_never_skips_a_bucket_with_rows(tb: TagBackend) -> None:
    start = hour_start(datetime.now(UTC)) - timedelta(hours=6)
    b0 = bucket_of_millis(int(start.timestamp() * 1000), "Hour")
    h = 3_600_000
    await tb.store.write_tag_rows([row("N|1", 1, start + timedelta(minutes=1))])
    await tb.store.write_tag_rows([row("N|1", 2, start + timedelta(hours=3, minutes=1))])
    nb = await tb.store.next_bucket("c", b0 + h, b0 + 5 * h)
    assert nb is not None and b0 + h <= nb <= b0 + 3 * h
    assert await tb.store.next_bucket("c", b0, b0 + 5 * h) == b0
    empty = await tb.store.next_bucket("c", b0 + 4 * h, b0 + 5 * h)
    assert empty is None or b0 + 4 * h <= empty <= b0 + 5 * h


async def test_progress_and_scanning_round_trip(tb: TagBackend) -> None:
    assert await tb.store.read_progress("G|1") == {}
    assert await tb.store.read_scanning("G|1") == 0
    u1 = timeuuid_for_event(datetime.now(UTC), "G|1", 3)
    u2 = timeuuid_for_event(datetime.now(UTC), "G|1", 5)
    await tb.store.write_progress([TagProgress("G|1", "a", 3, 2, u1), TagProgress("G|1", "b", 3, 1, u1)])
    await tb.store.write_progress([TagProgress("G|1", "a", 5, 3, u2)])  # overwrites a, keeps b
    await tb.store.write_progress([TagProgress("G|2", "a", 1, 1, u1)])
    assert await tb.store.read_progress("G|1") == {
        "a": TagProgress("G|1", "a", 5, 3, u2),
        "b": TagProgress("G|1", "b", 3, 1, u1),
    }
    await tb.store.write_scanning("G|1", 4)
    await tb.store.write_scanning("G|1", 9)
    assert await tb.store.read_scanning("G|1") == 9
    assert await tb.store.read_scanning("G|2") == 0


async def test_tagged_events_of_a_pid_from_a_seq_nr(tb: TagBackend) -> None:
    j = tb.journal
    await j.persist("E|1", [{"n": 1}, {"n": 2}], tags=["x", "y"], metadata={"m": 1})
    await j.persist("E|1", [{"n": 3}])  # untagged: listed with no tags
    await j.persist("E|1", [{"n": 4}], tags=["x"])
    await j.persist("E|2", [{"n": 1}], tags=["x"])
    evs = await tb.store.tagged_events("E|1", 2, 10)
    assert [(e.seq_nr, e.tags) for e in evs] == [(2, ("x", "y")), (3, ()), (4, ("x",))]
    assert [j.serializers.deserialize(e.event.ser_id, e.event.manifest, e.event.payload) for e in evs] == [
        {"n": 2}, {"n": 3}, {"n": 4},
    ]  # fmt: skip
    assert evs[0].writer == j.writer_id and evs[0].meta is not None and evs[1].meta is None
    assert [e.seq_nr for e in await tb.store.tagged_events("E|1", 1, 2)] == [1, 2]
    # the TimeUUID recovery resends with is the one the tag row was first written with
    rows = {(r[0], r[1], r[3]): r[5] for r in await tb.raw.tag_rows()}
    for e in await tb.store.tagged_events("E|1", 1, 10):
        for tag in e.tags:
            assert rows[(tag, "E|1", e.seq_nr)] == e.timeuuid


async def test_bucket_size_is_kept_and_refused_to_change_once_tagged_data_exists(tb: TagBackend) -> None:
    store = tb.store
    await store.ensure_bucket_size("Hour")  # what the journal opened with: unchanged
    await store.ensure_bucket_size("Day")  # no tagged data yet: may change
    await store.ensure_bucket_size("Hour")
    await store.write_tag_rows([row("Z|1", 1, datetime.now(UTC))])
    with pytest.raises(ConfigurationError, match=r"'Hour'.*cannot change to 'Minute'"):
        await store.ensure_bucket_size("Minute")
    await store.ensure_bucket_size("Hour")
