"""The current event's metadata inside event handlers, live and during recovery (real PostgreSQL)."""

from __future__ import annotations

from datetime import datetime

import pytest

from journal import EntityError, EntityRegistry, Journal, VectorTime
from tests.entity_fixtures import Tracer


async def test_event_handlers_see_the_metadata_and_whether_it_is_a_replay(journal: Journal) -> None:
    Tracer.seen = []
    async with EntityRegistry(journal) as registry:
        await registry.ask(Tracer, "t1", ("add", "a"))
        await registry.ask(Tracer, "t1", ("add", "b", ["tracer|other"]))
    live = list(Tracer.seen)
    assert [(s[0], s[1], s[2], s[3], s[4], s[5]) for s in live] == [
        ("a", 1, "tracer|t1", "tracer|t1", (), False),
        ("b", 2, "tracer|t1", "tracer|t1", ("tracer|other",), False),
    ]
    stored = [e async for e in journal.current_events_by_persistence_id("tracer|t1")]
    assert [s[6] for s in live] == [e.db_timestamp for e in stored]
    assert all(isinstance(s[6], datetime) for s in live)
    assert [s[7] for s in live] == [VectorTime({"tracer|t1": 1}), VectorTime({"tracer|t1": 2})]

    Tracer.seen = []
    async with EntityRegistry(journal) as registry:  # a new registry: the entity recovers by replay
        assert await registry.ask(Tracer, "t1", ("read",)) == ["a", "b"]
        replayed = list(Tracer.seen)
        await registry.ask(Tracer, "t1", ("add", "c"))
    assert [(s[0], s[1], s[5]) for s in replayed] == [("a", 1, True), ("b", 2, True)]
    assert [s[4] for s in replayed] == [(), ("tracer|other",)]
    assert [s[7] for s in replayed] == [s[7] for s in live]
    assert [(s[0], s[1], s[5]) for s in Tracer.seen[2:]] == [("c", 3, False)]


def test_current_event_outside_an_event_handler_is_refused() -> None:
    with pytest.raises(EntityError, match="only available inside on_event"):
        _ = Tracer("t2").current_event
