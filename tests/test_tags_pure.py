"""The pure parts of events by tag: TimeUUIDs, bucket math, writer batching, gap detection."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal.backend import TaggedEvent
from journal.buckets import BUCKET_MILLIS, bucket_of, bucket_of_millis, parse_first_bucket
from journal.errors import ConfigurationError
from journal.serialization import Serialized
from journal.settings import JournalSettings
from journal.tags.gaps import PidTracker, Verdict
from journal.tags.writer import TagWriterState, row_bytes
from journal.timeuuid import (
    datetime_of,
    max_timeuuid,
    min_timeuuid,
    new_timeuuid,
    sort_key,
    timeuuid_for_event,
    unix_millis,
)

SIZES = st.sampled_from(["Day", "Hour", "Minute"])
MILLIS = st.integers(min_value=0, max_value=4_000_000_000_000)


def test_reference_defaults() -> None:
    t = JournalSettings.load(env={}).tags
    assert (t.bucket_size, t.first_time_bucket, t.max_message_batch_size) == ("Hour", "20151120T00:00", 150)
    assert (t.tag_write_timeout, t.eventual_consistency_delay, t.gap_timeout) == (4.0, 5.0, 10.0)
    assert (t.new_persistence_id_scan_timeout, t.offset_scanning_period, t.max_missing_to_search) == (0.0, 0.2, 5000)
    assert (t.back_track_interval, t.back_track_period, t.query_refresh_interval) == (1.0, 5.0, 3.0)
    assert parse_first_bucket(t.first_time_bucket, "Hour") == int(datetime(2015, 11, 20, tzinfo=UTC).timestamp() * 1000)


def test_bad_tag_settings_refused() -> None:
    with pytest.raises(ConfigurationError):
        JournalSettings.load(env={}, bucket_size="Week")
    with pytest.raises(ConfigurationError):
        JournalSettings.load(env={}, first_time_bucket="2015-11-20")
    with pytest.raises(ConfigurationError):
        JournalSettings.load(env={}, max_message_batch_size=0)


@given(MILLIS, SIZES)
def test_bucket_contains_its_time(ms: int, size: str) -> None:
    b = bucket_of_millis(ms, size)
    assert b <= ms < b + BUCKET_MILLIS[size]
    assert b % BUCKET_MILLIS[size] == 0
    assert bucket_of(min_timeuuid(ms), size) == b == bucket_of(max_timeuuid(ms), size)


@given(MILLIS, MILLIS)
def test_timeuuid_order_follows_time(a: int, b: int) -> None:
    ua, ub = min_timeuuid(a), max_timeuuid(b)
    assert unix_millis(ua) == a and unix_millis(ub) == b
    if a <= b:
        assert sort_key(ua) < sort_key(ub)
    assert ua.version == 1 and ua.variant == uuid.RFC_4122


@given(
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)),
    st.text(min_size=1, max_size=20),
    st.integers(min_value=1, max_value=2**62),
)
def test_event_timeuuid_is_deterministic_and_keeps_the_time(ts: datetime, pid: str, seq: int) -> None:
    u = timeuuid_for_event(ts, pid, seq)
    assert u == timeuuid_for_event(ts, pid, seq)
    assert datetime_of(u) == ts
    assert u.version == 1


def test_new_timeuuid_strictly_increases() -> None:
    us = [new_timeuuid() for _ in range(5000)]
    keys = [sort_key(u) for u in us]
    assert keys == sorted(keys) and len(set(us)) == len(us)


def _ev(pid: str, seq: int, ms: int) -> TaggedEvent:
    ts = datetime.fromtimestamp(ms / 1000, UTC)
    return TaggedEvent(pid, seq, timeuuid_for_event(ts, pid, seq), ("t",), Serialized(1, "", b"{}"), "w")


@settings(max_examples=200)
@given(
    st.lists(st.tuples(st.sampled_from("abcde"), st.integers(0, 3 * 60_000)), min_size=1, max_size=300),
    st.integers(1, 20),
    SIZES,
)
def test_batches_bounded_never_span_buckets_numbering_per_pid(
    items: list[tuple[str, int]], max_batch: int, size: str
) -> None:
    state = TagWriterState("t", size, max_batch, flush_interval=0.0, max_buffered=10_000)
    seqs: dict[str, int] = {}
    for pid, ms in sorted(items, key=lambda x: x[1]):
        seqs[pid] = seqs.get(pid, 0) + 1
        state.add(_ev(pid, seqs[pid], 1_700_000_000_000 + ms), now=0.0)
    written = []
    while True:
        batch = state.next_batch(now=0.0)
        if batch is None:
            assert state.in_flight is None and not state.buffer
            break
        assert state.next_batch(now=0.0) is None  # one write in flight
        assert 1 <= len(batch) <= max_batch
        assert len({r.timebucket for r in batch}) == 1
        progress = state.completed()
        assert {p.persistence_id: p.tag_pid_seq_nr for p in progress} == {
            pid: max(r.tag_pid_seq_nr for r in batch if r.persistence_id == pid)
            for pid in {r.persistence_id for r in batch}
        }
        written.extend(batch)
    assert len(written) == len(items)
    for pid in seqs:
        assert [r.tag_pid_seq_nr for r in written if r.persistence_id == pid] == list(range(1, seqs[pid] + 1))


def test_flush_rules_size_interval_and_failure() -> None:
    state = TagWriterState("t", "Hour", 3, flush_interval=1.0, max_buffered=4)
    base = 1_700_000_000_000
    state.add(_ev("a", 1, base), now=0.0)
    assert state.next_batch(now=0.5) is None  # not full, not due
    assert state.flush_due_in(0.5) == pytest.approx(0.5)
    batch = state.next_batch(now=1.0)  # due
    assert batch is not None and len(batch) == 1
    state.failed()
    assert [r.tag_pid_seq_nr for r in state.buffer] == [1]  # back at the front, same number
    for s in (2, 3):
        state.add(_ev("a", s, base), now=1.0)
    batch = state.next_batch(now=1.0)  # full (3) though not due
    assert batch is not None and [r.tag_pid_seq_nr for r in batch] == [1, 2, 3]
    for s in (4, 5, 6, 7):
        state.add(_ev("a", s, base), now=1.0)
    assert not state.has_room()  # bounded buffer: the writer loop makes callers wait
    state.completed()
    dropped = state.reset_pid("a", None)
    assert len(dropped) == 4 and not state.buffer and state.counters["a"] == 0


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=60), st.integers(1, 12_000))
def test_batches_bounded_by_bytes_one_row_always_fits(sizes: list[int], max_bytes: int) -> None:
    state = TagWriterState("t", "Hour", 1000, flush_interval=0.0, max_buffered=10_000, max_bytes=max_bytes)
    for i, n in enumerate(sizes):
        ev = TaggedEvent("a", i + 1, timeuuid_for_event(datetime(2025, 1, 1, tzinfo=UTC), "a", i + 1), ("t",),
                         Serialized(1, "", b"x" * n), "w")  # fmt: skip
        state.add(ev, now=0.0)
    written = []
    while (batch := state.next_batch(now=0.0)) is not None:
        weight = sum(row_bytes(r) for r in batch)
        assert len(batch) == 1 or weight <= max_bytes
        if state.buffer:  # cut only where the next row would not fit
            assert weight + row_bytes(state.buffer[0]) > max_bytes
        state.completed()
        written.extend(batch)
    assert [r.seq_nr for r in written] == list(range(1, len(sizes) + 1))


def test_bucket_change_flushes_before_full() -> None:
    state = TagWriterState("t", "Minute", 100, flush_interval=60.0, max_buffered=100)
    state.add(_ev("a", 1, 1_700_000_000_000), now=0.0)
    assert state.next_batch(now=0.0) is None
    state.add(_ev("a", 2, 1_700_000_060_000), now=0.0)
    batch = state.next_batch(now=0.0)
    assert batch is not None and [r.tag_pid_seq_nr for r in batch] == [1]


@given(st.lists(st.integers(1, 30), min_size=1, max_size=60), st.booleans())
def test_gap_tracker(numbers: list[int], accept_unknown: bool) -> None:
    tracker = PidTracker(accept_unknown=accept_unknown)
    delivered: list[int] = []
    for n in numbers:
        v = tracker.classify("p", n)
        last = delivered[-1] if delivered else None
        if last is None:
            assert v is (Verdict.DELIVER if n == 1 or accept_unknown else Verdict.UNKNOWN_PID)
        elif n <= last:
            assert v is Verdict.DUPLICATE
        elif n == last + 1:
            assert v is Verdict.DELIVER
        else:
            assert v is Verdict.GAP
            assert tracker.missing("p", n) == (last + 1, n - 1)
        if v is Verdict.DELIVER:
            tracker.delivered("p", n)
            delivered.append(n)
    assert delivered == sorted(set(delivered))
