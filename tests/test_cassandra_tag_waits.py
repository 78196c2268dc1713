"""A tagged call on Cassandra waits for its own tag rows, never for another call's: one tag whose
rows are held at the store leaves the other calls of its group-commit batch answered at once."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from cassandra_fixtures import recent_first_bucket

from journal import JournalSettings, open_journal

pytestmark = pytest.mark.cassandra


class HoldsOneTag:
    """The tag writers' real store; the tag rows of ``tag`` wait until ``release`` is set."""

    def __init__(self, real: Any, tag: str) -> None:
        self._real = real
        self._tag = tag
        self.holding = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def write_tag_rows(self, rows: Any) -> None:
        if any(r.tag == self._tag for r in rows):
            self.holding.set()
            await self.release.wait()
        await self._real.write_tag_rows(rows)


async def test_a_held_tag_write_leaves_the_other_calls_of_its_batch_answered_at_once(cassandra_dsn: str) -> None:
    """One call tagged ``slow`` (its tag rows held at the store) and fifty tagged ``fast``, sent
    together: the fifty are answered while the slow one waits; once its rows go through, it is
    answered written and read by its tag."""
    run = uuid.uuid4().hex[:8]
    slow_pid, pids = f"Slow|{run}", [f"Fast|{run}-{i}" for i in range(51)]
    settings = JournalSettings.load(
        env={}, first_time_bucket=recent_first_bucket(), eventual_consistency_delay=0.0, tag_write_timeout=60.0
    )
    async with open_journal(cassandra_dsn, settings=settings) as j:
        store = HoldsOneTag(j.backend.tag_writers.store, "slow")
        j.backend.tag_writers.store = store
        first = asyncio.ensure_future(j.persist(pids[0], ["f"], tags=["fast"]))  # the idle path; the rest queue
        slow = asyncio.ensure_future(j.persist(slow_pid, ["s"], tags=["slow"]))
        rest = [asyncio.ensure_future(j.persist(p, ["f"], tags=["fast"])) for p in pids[1:]]
        try:
            await asyncio.wait_for(asyncio.gather(first, *rest), 20)
            assert store.holding.is_set()
            assert not slow.done()
        finally:
            store.release.set()
        (env,) = await asyncio.wait_for(slow, 30)
        assert env.seq_nr == 1
        assert [e.persistence_id async for e in j.current_events_by_tag("slow")] == [slow_pid]
        assert sorted([e.persistence_id async for e in j.current_events_by_tag("fast")]) == sorted(pids)
