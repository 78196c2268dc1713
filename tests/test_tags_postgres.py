"""Events by tag, what is PostgreSQL's own: the tag rows written in the events' statement, with the
deterministic TimeUUID. The behaviour both backends share (query, tag writer, recovery, gaps) is
tested on both in test_tags_backends.py and test_tag_store_contract.py."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from conftest import truncate_all

from journal import (
    InvalidArgument,
    Journal,
    JournalSettings,
    OffsetError,
    TimeUUIDOffset,
    open_journal,
)
from journal.backend import TagStore
from journal.postgres.backend import PostgresBackend
from journal.timeuuid import timeuuid_for_event

FAST = dict(
    eventual_consistency_delay=0.0,
    query_refresh_interval=0.05,
    gap_timeout=1.5,
    back_track_interval=0.1,
    back_track_period=2.0,
    tag_write_timeout=1.0,
    retry_initial_backoff=0.02,
    retry_max_backoff=0.1,
)


def tag_settings(dsn: str, **more: Any) -> JournalSettings:
    return JournalSettings.load(env={}, dsn=dsn, **{**FAST, **more})


@pytest.fixture
async def tj(dsn: str) -> AsyncIterator[Journal]:
    await truncate_all(dsn)
    async with open_journal(dsn, settings=tag_settings(dsn)) as j:
        yield j


def store_of(j: Journal) -> TagStore:
    assert isinstance(j.backend, PostgresBackend)
    return j.backend.tag_store()


async def collect(it: AsyncIterator[Any]) -> list[Any]:
    return [x async for x in it]


async def test_tagged_persist_writes_tag_rows_in_the_same_statement(tj: Journal, dsn: str) -> None:
    envs = await tj.persist("Acc|1", [{"n": 1}, {"n": 2}], tags=["blue", "red"])
    await tj.persist("Acc|2", [{"n": 3}], tags=["blue"])
    await tj.persist("Acc|3", [{"n": 4}])  # untagged: the fast path, no tag rows
    blue = await collect(tj.current_events_by_tag("blue"))
    assert [(e.persistence_id, e.seq_nr, e.event) for e in blue] == [
        ("Acc|1", 1, {"n": 1}),
        ("Acc|1", 2, {"n": 2}),
        ("Acc|2", 1, {"n": 3}),
    ]
    assert all(isinstance(e.offset, TimeUUIDOffset) for e in blue)
    # the UUID is the deterministic one the Python side computes (so resends are idempotent)
    assert blue[0].offset == TimeUUIDOffset(timeuuid_for_event(envs[0].db_timestamp, "Acc|1", 1))
    assert blue[0].db_timestamp == envs[0].db_timestamp and blue[0].entity_type == "Acc"
    assert [e.seq_nr for e in await collect(tj.current_events_by_tag("red"))] == [1, 2]
    # resume after an offset (exclusive)
    rest = await collect(tj.current_events_by_tag("blue", blue[0].offset))
    assert [(e.persistence_id, e.seq_nr) for e in rest] == [("Acc|1", 2), ("Acc|2", 1)]
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT tag_name, persistence_id, tag_pid_sequence_nr, sequence_nr FROM tag_views ORDER BY 1, 2, 3"
        )
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [
        ("blue", "Acc|1", 1, 1),
        ("blue", "Acc|1", 2, 2),
        ("blue", "Acc|2", 1, 1),
        ("red", "Acc|1", 1, 1),
        ("red", "Acc|1", 2, 2),
    ]


async def test_bad_tags_and_offsets_refused_before_io(tj: Journal) -> None:
    for bad in ("", "x" * 256, "a\x00b"):
        with pytest.raises(InvalidArgument):
            await tj.persist("Acc|1", [1], tags=[bad])
        with pytest.raises(InvalidArgument):
            tj.current_events_by_tag(bad)
    with pytest.raises(OffsetError):
        tj.current_events_by_tag("t", 42)  # type: ignore[arg-type]
    with pytest.raises(OffsetError):
        TimeUUIDOffset("not-a-uuid")  # type: ignore[arg-type]
    assert await tj.highest_seq_nr("Acc|1") == 0
