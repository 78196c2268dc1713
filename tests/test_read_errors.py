"""What a reader is told when a stored row does not read (issue 32): a row of a newer release
(``Placed#4`` while this release registers ``Placed`` up to version 3) raises UnknownVersion
instead of reading back as a plain dict, unless a step from that version is registered; an
upcaster that raises is named with its error; every read path names the row as ``pid#seq_nr``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from journal import (
    EventEnvelope,
    Journal,
    JournalSettings,
    SerializationError,
    SerializerRegistry,
    UnknownVersion,
    open_journal,
)

NAME = "shop:Placed"


@dataclass
class PlacedV3:
    order: str
    cents: int


@dataclass
class PlacedV4:
    order: str
    cents: int
    channel: str


def release(version: int) -> SerializerRegistry:
    reg = SerializerRegistry()
    reg.register_type(PlacedV4 if version == 4 else PlacedV3, manifest=NAME, version=version)
    return reg


async def read_every_way(j: Journal, pid: str) -> list[BaseException | list[Any]]:
    """The pid query, the slice query and the tag query: each one's events, or its error."""
    out: list[BaseException | list[Any]] = []
    queries: list[Callable[[], AsyncIterator[EventEnvelope]]] = [
        lambda: j.current_events_by_persistence_id(pid),
        lambda: j.current_events_by_slices(pid.split("|")[0], 0, 1023),
        lambda: j.current_events_by_tag("placed"),
    ]
    for query in queries:
        try:
            out.append([e.event async for e in query()])
        except SerializationError as e:
            out.append(e)
    return out


async def test_a_row_of_a_newer_release_is_an_error_on_every_read_path(journal: Journal, dsn: str) -> None:
    settings = JournalSettings.load(env={}, dsn=dsn, eventual_consistency_delay=0.0)
    async with open_journal(dsn, settings=settings, serializers=release(4)) as newer:
        await newer.persist("Order|o1", [PlacedV4("o1", 250, "web")], tags=["placed"])
    async with open_journal(dsn, settings=settings, serializers=release(3)) as older:
        got = await read_every_way(older, "Order|o1")
    for e in got:
        assert isinstance(e, UnknownVersion), e  # typed, on each path
        assert "Order|o1#1" in str(e) and f"'{NAME}#4' is version 4" in str(e) and "up to version 3" in str(e)

    reg = release(3)  # the documented choice: a step from the newer version to this one
    reg.upcasters.add(NAME, 4, lambda d: {k: v for k, v in d.items() if k != "channel"}, to_version=3)
    async with open_journal(dsn, settings=settings, serializers=reg) as older:
        assert await read_every_way(older, "Order|o1") == [[PlacedV3("o1", 250)]] * 3


def broken_upcaster(data: dict[str, Any]) -> dict[str, Any]:
    return {"order": data["order"], "cents": data["amount"] * 100}


async def test_an_upcaster_that_raises_is_named_with_its_error(journal: Journal, dsn: str) -> None:
    settings = JournalSettings.load(env={}, dsn=dsn, eventual_consistency_delay=0.0)
    async with open_journal(dsn, settings=settings, serializers=release(2)) as first:
        await first.persist("Order|o2", [PlacedV3("o2", 1)], tags=["placed"])  # stored as version 2
    reg = release(3)
    reg.upcasters.add(NAME, 2, broken_upcaster)
    async with open_journal(dsn, settings=settings, serializers=reg) as later:
        got = await read_every_way(later, "Order|o2")
    for e in got:
        assert isinstance(e, SerializationError), e
        text = str(e)
        assert "Order|o2#1" in text, text
        named = f"upcaster {broken_upcaster.__module__}:broken_upcaster of '{NAME}#2' to '{NAME}#3'"
        assert f"{named} raised KeyError: 'amount'" in text, text


def test_a_type_registered_at_no_version_reads_any_as_data() -> None:
    """Only a registered name has a newest version: unregistered manifests read as plain data."""
    reg = SerializerRegistry()
    assert reg.deserialize(1, "shop:Other#7", b'{"a": 1}') == {"a": 1}
    with pytest.raises(UnknownVersion):
        release(3).deserialize(1, f"{NAME}#5", b'{"order": "x", "cents": 1}')


async def test_a_plain_json_row_that_is_not_json_is_a_located_error(journal: Journal, dsn: str) -> None:
    """A row of plain JSON (no manifest) is read by parsing alone on the slice query's hot path
    (:meth:`SerializerRegistry.plain_json_reader`); a payload that is not JSON is still an error
    naming the row and why."""
    settings = JournalSettings.load(env={}, dsn=dsn, eventual_consistency_delay=0.0)
    async with open_journal(dsn, settings=settings) as j:
        await j.persist("Plain|p1", [{"n": 1}, {"n": 2}], tags=["placed"])
        assert await read_every_way(j, "Plain|p1") == [[{"n": 1}, {"n": 2}]] * 3
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "UPDATE event_journal SET event_payload = 'not json' WHERE persistence_id = 'Plain|p1' AND seq_nr = 2"
        )
    finally:
        await conn.close()
    async with open_journal(dsn, settings=settings) as plain:
        got = await read_every_way(plain, "Plain|p1")
    for e in got[:2]:  # the pid and slice queries (the tag query reads its view's own copy)
        assert isinstance(e, SerializationError), e
        assert "Plain|p1#2" in str(e) and "cannot deserialize event" in str(e), e
