"""The records the Kafka publisher builds (projections/kafka/records.py): with the encodings it
reuses across events, each record is still exactly the event's key, its JSON as the journal's
serializer writes it, and its five headers computed from the event alone."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from journal import JournalSettings, open_journal
from journal.envelope import EventEnvelope
from journal.offsets import TimestampOffset
from journal.serialization import JsonSerializer
from projections.kafka.records import RecordBuilder


@dataclasses.dataclass
class Shipped:
    order: str
    items: int


def envelope(pid: str, seq_nr: int, slice_: int, at: datetime, event: Any) -> EventEnvelope:
    return EventEnvelope(pid, "Order", slice_, seq_nr, at, event, TimestampOffset(at, {}))


def expected(e: EventEnvelope) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    json = JsonSerializer()
    headers = [
        ("pid", e.persistence_id.encode()), ("seq_nr", str(e.seq_nr).encode()), ("slice", str(e.slice).encode()),
        ("db_timestamp", e.db_timestamp.isoformat().encode()), ("manifest", json.manifest(e.event).encode()),
    ]  # fmt: skip
    return e.persistence_id.encode(), json.to_bytes(e.event), headers


def test_records_match_the_event_alone() -> None:
    t = datetime(2026, 11, 27, 8, 0, tzinfo=UTC)
    events: list[Any] = [{"n": 1, "pad": "x"}, Shipped("o-1", 3), [1, 2.5, None], "text", {"nested": {"a": [1]}}]
    envs = [
        envelope(f"Order|{i % 3}", i + 1, (i * 37) % 1024, t + timedelta(microseconds=i // 2), events[i % len(events)])
        for i in range(40)
    ]
    builder = RecordBuilder()
    got = [*builder.records(envs), *builder.records(reversed(envs))]  # the second batch from the caches
    assert got == [expected(e) for e in envs + list(reversed(envs))]


def test_the_timestamp_header_is_isoformat_whatever_the_zone() -> None:
    """UTC timestamps (the journal's) are written by orjson: the same text as ``isoformat``, with
    or without microseconds, at the ends of the range; other zones too, an offset in seconds kept."""
    zones = [
        UTC,
        UTC,
        UTC,
        UTC,
        timezone(timedelta(hours=-5, minutes=-30)),
        timezone(timedelta(seconds=30)),
        timezone(timedelta(hours=2)),
    ]
    stamps = [
        datetime(2026, 11, 27, 8, 0, 0, 123456), datetime(2026, 11, 27, 8, 0), datetime(1, 1, 1),
        datetime(9999, 12, 31, 23, 59, 59, 999999), datetime(2026, 11, 27, 8, 0, 0, 5), datetime(2026, 11, 27, 8, 0),
        datetime(2026, 11, 27, 8, 0, 0, 1),
    ]  # fmt: skip
    envs = [
        envelope("Order|1", i + 1, 7, ts.replace(tzinfo=z), {"n": i})
        for i, (ts, z) in enumerate(zip(stamps, zones, strict=True))
    ]
    got = [dict(headers)["db_timestamp"] for _k, _v, headers in RecordBuilder().records(envs)]
    assert got == [e.db_timestamp.isoformat().encode() for e in envs]
    assert got[5] == b"2026-11-27T08:00:00+00:00:30"


async def test_events_read_back_are_published_as_stored(dsn: str) -> None:
    """Events read from the journal, by slices and by tag: a plain JSON one goes out as its stored
    bytes (not decoded), a typed one decoded and dumped; either way the record is what the event
    alone gives."""
    settings = JournalSettings.load(env={}, dsn=dsn, eventual_consistency_delay=0.0)
    events: list[Any] = [{"n": 1, "pad": "x"}, Shipped("o-1", 3), [1, 2.5, None], "text", {"é": {"a": [1]}}]
    pid = f"Order|{uuid.uuid4().hex[:8]}"
    async with open_journal(dsn, settings=settings) as journal:
        journal.serializers.register_type(Shipped)
        await journal.persist(pid, events, tags=[pid])
        by_slices = [e async for e in journal.current_events_by_slices("Order", 0, 1023) if e.persistence_id == pid]
        by_tag = [e async for e in journal.current_events_by_tag(pid)]
        for envs in (by_slices, by_tag):
            assert [e.stored_json() is not None for e in envs] == [True, False, True, True, True]
            got = list(RecordBuilder().records(envs))
            assert [value for _k, value, _h in got] == [JsonSerializer().to_bytes(e) for e in events]
            assert got == [expected(e) for e in envs]
