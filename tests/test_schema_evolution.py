"""Schema evolution (issue 26): rows written by an earlier release's classes are read through the
upcasters on every read path: by pid (current and live), by slices (current and live), by tag,
one envelope, snapshots, entity recovery, projections and replicated entities."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from journal import EntityRegistry, EventEnvelope, EventSeq, Journal, JournalSettings, SerializerRegistry, open_journal
from journal.errors import ConfigurationError, SerializationError
from journal.replication.entity import ReplicatedEntities, ReplicatedEntity
from journal.upcasting import split_version, versioned
from projections import Worker
from tests.evolution_events import (
    ADDRESS,
    ITEM_ADDED,
    PLACED,
    CityChanged,
    LineAdded,
    OldPlaced,
    Order,
    Placed,
    StreetChanged,
    old_events,
    old_registry,
    registry,
)
from tests.support.waiting import wait_until

PID = "Order|o1"
UPCAST = [
    Placed("o1", 1250, "EUR"),
    LineAdded("o1", "sku-1"),
    EventSeq([StreetChanged("o1", "Main St 1"), CityChanged("o1", "Ghent")]),
]
"""What the three old rows of ``PID`` read as today."""


@pytest.fixture
def settings(dsn: str) -> JournalSettings:
    return JournalSettings.load(env={}, dsn=dsn, eventual_consistency_delay=0.0)  # tag reads see the rows at once


@pytest.fixture
async def today(journal: Journal, settings: JournalSettings) -> AsyncIterator[Journal]:
    """Old rows (written with the earlier release's classes), then a journal with today's."""
    async with open_journal(settings.connection.dsn, settings=settings, serializers=old_registry()) as old:
        await old.persist(PID, old_events("o1"), tags=["orders"])
        await old.save_snapshot(PID, 1, OldPlaced("o1", 12.5))
    async with open_journal(settings.connection.dsn, settings=settings, serializers=registry()) as j:
        yield j


def events(envs: Sequence[EventEnvelope]) -> list[Any]:
    return [e.event for e in envs if e.persistence_id == PID]


async def first(it: AsyncIterator[EventEnvelope], n: int) -> list[EventEnvelope]:
    out: list[EventEnvelope] = []
    async for e in it:
        if e.persistence_id == PID:
            out.append(e)
        if len(out) == n:
            return out
    return out


async def test_old_rows_are_upcast_on_every_read_path(today: Journal, settings: JournalSettings) -> None:
    j = today
    by_pid = [e async for e in j.current_events_by_persistence_id(PID)]
    assert events(by_pid) == UPCAST
    assert [e.seq_nr for e in by_pid] == [1, 2, 3]  # a split keeps its row's one seq_nr
    assert events(await asyncio.wait_for(first(j.events_by_persistence_id(PID), 3), 30)) == UPCAST
    assert events([e async for e in j.current_events_by_slices("Order", 0, 1023)]) == UPCAST
    assert events(await asyncio.wait_for(first(j.events_by_slices("Order", 0, 1023), 3), 30)) == UPCAST
    assert events([e async for e in j.current_events_by_tag("orders")]) == UPCAST
    one = await j.load_envelope(PID, 3)
    assert one is not None and one.event == UPCAST[2]
    snap = await j.load_snapshot(PID)
    assert snap is not None and snap.state == Placed("o1", 1250, "EUR")

    async with EntityRegistry(j) as entities:  # recovery: the split applied as two events
        state = await entities.ask(Order, "o1", "read")
    assert state == [UPCAST[0], LineAdded("o1", "sku-1"), StreetChanged("o1", "Main St 1"), CityChanged("o1", "Ghent")]

    seen: list[Any] = []

    async def handler(_conn: Any, envs: Sequence[EventEnvelope]) -> None:
        seen.extend(events(envs))

    worker = Worker(j, settings, "evolution", "Order", handler, "grouped")
    task = asyncio.create_task(worker.run())
    await wait_until(lambda: len(seen) == 3 or task.done(), 30, "the projection")
    worker.stop()
    await task
    assert seen == UPCAST


async def test_replicated_entities_read_old_rows_through_the_upcasters(today: Journal) -> None:
    class Replicated(ReplicatedEntity[list[Any]]):
        entity_type = "Order"

        def initial_state(self) -> list[Any]:
            return []

        def on_event(self, state: list[Any], event: Any) -> list[Any]:
            return [*state, event]

    store = today.backend.replication_store("A")
    await store.ensure_log("Order")
    loaded = await ReplicatedEntities(today, store).load(Replicated("o1"))
    assert loaded.state == [UPCAST[0], UPCAST[1], *UPCAST[2]]


async def test_new_rows_carry_the_version_and_the_tool_counts_them(today: Journal, dsn: str) -> None:
    await today.persist("Order|o2", [Placed("o2", 500, "USD")])
    stored = await today.backend.read_events("Order|o2", 1, 1, 1)
    assert stored[0].ser_manifest == f"{PLACED}#2"  # the version rides in the manifest column
    assert [e.event async for e in today.current_events_by_persistence_id("Order|o2")] == [Placed("o2", 500, "USD")]
    rows = {(m.kind, m.name, m.version): (m.rows, m.upcast) for m in await today.stored_manifests()}
    assert rows == {
        ("event", PLACED, 1): (1, True), ("event", PLACED, 2): (1, False), ("event", ITEM_ADDED, 1): (1, True),
        ("event", ADDRESS, 1): (1, True), ("snapshot", PLACED, 1): (1, True),
    }  # fmt: skip
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", "from journal.cli import main; main()", "manifests", "--dsn", dsn, "--json",
         "--registry", "tests.evolution_events:registry"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    listed = {(r["kind"], r["name"], r["version"], r["rows"], r["upcast"]) for r in json.loads(out.stdout)}
    assert ("event", PLACED, 2, 1, False) in listed and ("event", ADDRESS, 1, 1, True) in listed


def test_upcaster_registration_and_chains() -> None:
    assert split_version("a:B#12") == ("a:B", 12) and split_version("a:B") == ("a:B", 1)
    assert split_version("#3") == ("#3", 1) and versioned("a:B", 1) == "a:B"
    r = SerializerRegistry()
    r.upcasters.add("m", 1, lambda d: {**d, "b": 1})
    r.upcasters.add("m", 2, lambda d: {**d, "c": 2}, to="n", to_version=1)  # a rename with a change
    assert r.deserialize(1, "m", b'{"a": 0}') == {"a": 0, "b": 1, "c": 2}
    assert r.deserialize(1, "m#2", b'{"a": 0}') == {"a": 0, "c": 2}
    assert r.deserialize(1, "m#3", b'{"a": 0}') == {"a": 0}  # no upcaster: read as it is
    for bad in [("m", 1), ("m#2", 1), ("", 1), ("x", 0)]:
        with pytest.raises(ConfigurationError):
            r.upcasters.add(bad[0], bad[1], lambda d: d)
    r.upcasters.rename("loop", "loop2")
    r.upcasters.rename("loop2", "loop")
    with pytest.raises(SerializationError, match="did not end"):
        r.deserialize(1, "loop", b"{}")
    with pytest.raises(ConfigurationError):
        r.register_type(Placed, version=0)
