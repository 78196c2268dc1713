"""The slice query algorithms step by step (no database): horizon fallback, paging, triggers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from journal.backend import HorizonReading, StoredEvent, WriterInProgress
from journal.offsets import EPOCH, TimestampOffset
from journal.query.horizon import HorizonTracker
from journal.query.slice_query import SliceQueryState, poll_delay

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def reading(now: int, *writers: tuple[str, int | None]) -> HorizonReading:
    return HorizonReading(
        now=at(now),
        writers=tuple(WriterInProgress(v, 1, at(s) if s is not None else None) for v, s in writers),
    )


def test_horizon_is_the_oldest_writer_start_capped_by_now() -> None:
    t = HorizonTracker()
    assert t.observe(reading(100)) == at(100)
    assert t.observe(reading(200, ("1/5", 150), ("2/7", 120))) == at(120)
    assert t.observe(reading(300, ("1/5", 150))) == at(150)
    assert t.observe(reading(400)) == at(400)


def test_unknown_writer_start_falls_back_to_previous_check() -> None:
    t = HorizonTracker()
    assert t.observe(reading(100)) == at(100)
    # first seen now with no visible start: it took the lock after the check at 100
    assert t.observe(reading(200, ("3/9", None))) == at(100)
    # still there later: keeps the bound it got when first seen, never a later one
    assert t.observe(reading(300, ("3/9", None))) == at(100)
    assert t.observe(reading(400)) == at(400)


def test_unknown_writer_at_first_check_blocks_at_epoch() -> None:
    t = HorizonTracker()
    assert t.observe(reading(100, ("4/1", None))) == EPOCH
    assert t.has_first_check_unknowns
    # a writer first seen at the second check is bounded by the first check
    assert t.observe(reading(200, ("4/1", None), ("5/1", None))) == EPOCH
    assert t.observe(reading(300, ("5/1", None))) == at(100)


def test_prepared_transaction_uses_the_fallback() -> None:
    t = HorizonTracker()
    t.observe(reading(100))
    r = HorizonReading(now=at(200), writers=(WriterInProgress("-1/77", None, None),), prepared=1)
    assert t.observe(r) == at(100)


def ev(pid: str, seq: int, ms: int) -> StoredEvent:
    return StoredEvent(pid, "e", 0, seq, at(ms), 1, "", b"{}", "w")


def test_paging_window_probe_and_heartbeat_floor() -> None:
    s = SliceQueryState(None, buffer_size=2)
    bound = at(10_000)
    req = s.request(bound)
    assert req is not None and req.from_timestamp == EPOCH and req.to_timestamp < bound
    s.accept(req, [], bound)  # empty window far from the data: probe
    assert s.needs_probe and s.probe_from == req.to_timestamp
    s.skip_to(at(5_000))
    req = s.request(bound)
    assert req is not None and req.from_timestamp == at(5_000)
    rows = [ev("a", 1, 5_000), ev("a", 2, 5_000)]
    offs = [s.offset_for(r) for r in rows]
    assert offs[1] == TimestampOffset(at(5_000), {"a": 2})
    s.accept(req, rows, bound)  # full page: not caught up, same timestamp next with seen
    req = s.request(bound)
    assert req is not None and req.from_timestamp == at(5_000) and dict(req.seen) == {"a": 2}
    s.accept(req, [], bound)
    assert s.heartbeat_offset() == TimestampOffset(req.to_timestamp)


@given(st.integers(0, 2000), st.integers(1, 1000))
def test_poll_delay_follows_the_fill(count: int, size: int) -> None:
    d = poll_delay(min(count, size), size, 3.0)
    fill = min(count, size) / size
    assert d == (0.0 if fill >= 0.9 else 1.5 if fill > 0.1 else 3.0)
