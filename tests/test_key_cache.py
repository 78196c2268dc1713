"""The key cache of encrypted payloads (issue 32): a key is never evicted while in use, so a cache
smaller than one call's or one page's subjects still writes and reads everything, concurrent
calls do not evict each other's keys, and "forgotten" is never said of a subject that was not."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from journal import Forgotten, Journal, JournalSettings, Write, open_journal
from journal.codec import KeyCache


def tiny(dsn: str, size: int, **more: Any) -> JournalSettings:
    return JournalSettings.load(
        env={}, dsn=dsn, encrypt=True, key_cache_size=size, eventual_consistency_delay=0.0, **more
    )


def test_a_held_key_survives_eviction_and_one_no_longer_held_goes() -> None:
    cache = KeyCache(ttl=30.0, size=1)
    held = cache.put({"a": b"ka", "b": b"kb", "c": b"kc"}, 0.0)
    assert [cache.get(s) for s in "abc"] == [(b"ka", True), (b"kb", True), (b"kc", True)]
    del held
    gc.collect()
    assert [cache.get(s)[1] for s in "abc"] == [False, False, True]  # only the most recent one is kept
    again = cache.put({"a": b"ka"}, 0.0)
    cache.forget("a")  # a forget reaches the key a page still holds
    assert again[0].key is None and cache.get("a") == (None, True)


@pytest.mark.parametrize("size", [1, 16])
async def test_writes_and_reads_of_more_subjects_than_the_cache_holds(journal: Journal, dsn: str, size: int) -> None:
    et = f"KeyCache{size}"
    pids = [f"{et}|m{i}" for i in range(64)]
    async with open_journal(dsn, settings=tiny(dsn, size, buffer_size=10)) as j:
        outcomes = await j.persist_many([Write(p, [{"n": p}, {"n": p, "again": True}], tags=["kc"]) for p in pids])
        assert [type(o).__name__ for o in outcomes] == ["Written"] * 64
        await asyncio.gather(*(j.persist(p, [{"n": p, "third": True}]) for p in pids))  # concurrent calls
        # read pages hold their keys: envelopes decoded only after every page of the query was read
        envs = [e async for e in j.current_events_by_slices(et, 0, 1023)]
        assert len(envs) == 3 * 64
        assert {e.persistence_id for e in envs if e.event["n"] == e.persistence_id} == set(pids)
        tagged = [e async for e in j.current_events_by_tag("kc")]
        assert sorted(e.event["n"] for e in tagged) == sorted(pids * 2)
        for p in pids[:8]:
            assert [e.seq_nr async for e in j.current_events_by_persistence_id(p)] == [1, 2, 3]

    async with open_journal(dsn, settings=tiny(dsn, size, buffer_size=10)) as j:  # a cold cache
        envs = [e async for e in j.current_events_by_slices(et, 0, 1023)]
        assert sum(1 for e in envs if e.event["n"] == e.persistence_id) == 3 * 64
        assert await j.forget(pids[0]) is True
        envs = [e async for e in j.current_events_by_slices(et, 0, 1023)]
        forgotten = {e.persistence_id for e in envs if isinstance(e.event, Forgotten)}
        assert forgotten == {pids[0]}


async def test_a_page_read_before_a_forget_reads_forgotten_after_it(journal: Journal, dsn: str) -> None:
    pids = [f"KeyCacheF|f{i}" for i in range(20)]
    async with open_journal(dsn, settings=tiny(dsn, 1)) as j:
        await j.persist_many([Write(p, [{"n": p}]) for p in pids])
        envs = [e async for e in j.current_events_by_slices("KeyCacheF", 0, 1023)]  # not decoded yet
        await j.forget(pids[3])
        assert {e.persistence_id for e in envs if isinstance(e.event, Forgotten)} == {pids[3]}
        assert sum(1 for e in envs if e.event == {"n": e.persistence_id}) == 19
