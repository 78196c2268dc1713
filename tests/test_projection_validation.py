"""Validation (duplicate / accept / gap / unknown) as a plain class, step by step and by property."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from journal.envelope import EventEnvelope
from journal.offsets import TimestampOffset
from projections.validation import Validator, Verdict

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def env(pid: str, seq: int, ts: datetime | None = None, slice_: int = 7) -> EventEnvelope:
    ts = ts or T0 + timedelta(seconds=seq)
    return EventEnvelope(pid, "T", slice_, seq, ts, None, TimestampOffset(ts))


def test_steps() -> None:
    v = Validator(timedelta(minutes=5))
    v.load_slice(7, None, [])
    assert v.check(env("a", 1)).verdict is Verdict.ACCEPT
    v.record(env("a", 1))
    assert v.check(env("a", 1)).verdict is Verdict.DUPLICATE
    assert v.check(env("a", 2)).verdict is Verdict.ACCEPT
    gap = v.check(env("a", 5))
    assert gap.verdict is Verdict.GAP and gap.gap_from == 2
    assert v.check(env("b", 3)).verdict is Verdict.UNKNOWN
    v.rollback()
    assert v.check(env("a", 1)).verdict is Verdict.ACCEPT  # rolled back: nothing committed
    v.record(env("a", 1))
    v.commit()
    assert v.known_seq_nr(7, "a") == 1
    assert v.slices[7].latest == T0 + timedelta(seconds=1)


def test_slice_offset_covers_evicted_pids_and_start() -> None:
    v = Validator(timedelta(minutes=5))
    latest = T0 + timedelta(hours=1)
    v.load_slice(7, latest, [("x", 4, latest), ("", 0, latest)])
    assert v.check(env("x", 4, latest)).verdict is Verdict.DUPLICATE
    assert v.check(env("old", 9, T0)).verdict is Verdict.DUPLICATE  # before the slice offset
    assert v.check(env("old", 9, latest + timedelta(seconds=1))).verdict is Verdict.UNKNOWN
    assert v.check(env("new", 1, latest + timedelta(seconds=1))).verdict is Verdict.ACCEPT
    assert v.start_timestamp(range(7, 8)) == latest
    assert v.start_timestamp(range(7, 9)) is None  # slice 8 has no offset: from the beginning
    v.learn(7, "old", 8, T0)
    assert v.check(env("old", 9, latest + timedelta(seconds=1))).verdict is Verdict.ACCEPT


def test_per_pid_mode_ignores_the_slice_offset_for_pids_not_in_memory() -> None:
    """Backtracking mode: a late commit below the slice offset is not a duplicate by that offset."""
    v = Validator(timedelta(minutes=5))
    latest = T0 + timedelta(hours=1)
    v.load_slice(7, latest, [("x", 4, latest)])
    below = latest - timedelta(seconds=2)  # within the window, below the slice offset
    assert v.check(env("late", 1, below)).verdict is Verdict.DUPLICATE  # horizon: by the slice offset
    assert v.check(env("late", 1, below), per_pid=True).verdict is Verdict.ACCEPT
    assert v.window_start(7) == latest - timedelta(minutes=5)
    # older than the window, or seq_nr > 1: the runner looks the pid up (store, then journal)
    assert v.check(env("old", 1, T0), per_pid=True).verdict is Verdict.UNKNOWN
    assert v.check(env("late", 2, below), per_pid=True).verdict is Verdict.UNKNOWN
    assert v.check(env("x", 4, latest), per_pid=True).verdict is Verdict.DUPLICATE  # in memory
    assert v.check(env("x", 5, below), per_pid=True).verdict is Verdict.ACCEPT


def test_eviction_keeps_the_window() -> None:
    v = Validator(timedelta(minutes=5), max_pids=2)
    for i, pid in enumerate(["a", "b", "c"]):
        v.record(env(pid, 1, T0 + timedelta(minutes=10 * i)))
    v.commit()
    assert v.known_seq_nr(7, "c") == 1
    assert v.known_seq_nr(7, "a") is None  # older than the window behind the latest offset
    assert v.check(env("a", 1, T0)).verdict is Verdict.DUPLICATE  # still covered by the slice offset


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 8), min_size=1, max_size=5),
    data=st.data(),
)
def test_any_delivery_order_with_duplicates_processes_each_event_once_in_order(
    lengths: list[int], data: st.DataObject
) -> None:
    """Deliveries may repeat and skip; with gap replay every event is handled once, per pid in order."""
    pids = [f"p{i}" for i in range(len(lengths))]
    stream = data.draw(st.lists(st.tuples(st.integers(0, len(pids) - 1), st.integers(1, 8)), min_size=1, max_size=40))
    commit_every = data.draw(st.integers(1, 5))
    v = Validator(timedelta(minutes=5))
    handled: list[tuple[str, int]] = []
    for n, (i, seq) in enumerate(stream):
        pid, seq = pids[i], min(seq, lengths[i])
        e = env(pid, seq, slice_=i)  # one slice per pid: the slice offset never hides another pid
        c = v.check(e)
        if c.verdict is Verdict.UNKNOWN:  # no store: everything before was never processed
            c = type(c)(Verdict.GAP, gap_from=1)
        if c.verdict is Verdict.DUPLICATE:
            continue
        if c.verdict is Verdict.GAP:
            for s in range(c.gap_from, seq):
                v.record(env(pid, s, slice_=i))
                handled.append((pid, s))
        v.record(e)
        handled.append((pid, seq))
        if n % commit_every == 0:
            v.commit()
    for pid in pids:
        seqs = [s for p, s in handled if p == pid]
        assert seqs == list(range(1, len(seqs) + 1))
    delivered_max = {pids[i]: min(s, lengths[i]) for i, s in stream}
    for pid, top in delivered_max.items():
        assert max(s for p, s in handled if p == pid) >= top


@settings(max_examples=100, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=20))
def test_rollback_leaves_committed_state_unchanged(outcomes: list[bool]) -> None:
    v = Validator(timedelta(minutes=5))
    committed = 0
    for ok in outcomes:
        v.record(env("a", committed + 1))
        if ok:
            v.commit()
            committed += 1
        else:
            v.rollback()
        assert (v.known_seq_nr(7, "a") or 0) == committed


@settings(max_examples=300, deadline=None)
@given(
    stored=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6)), max_size=4),
    batch=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 8), st.booleans()), min_size=1, max_size=30),
    latest=st.integers(0, 10),
    per_pid=st.booleans(),
)
def test_accept_next_agrees_with_check_and_record_one_by_one(
    stored: list[tuple[int, int]], batch: list[tuple[int, int, bool]], latest: int, per_pid: bool
) -> None:
    """A batch validated in one call accepts and records exactly what ``check`` then ``record``
    per envelope would, and stops at the first envelope it does not accept (heartbeats too)."""
    t = [env(f"p{i}", seq, slice_=i % 2) for i, seq, _ in batch]
    envs = [
        e if not hb else EventEnvelope("", "T", 0, 0, e.db_timestamp, None, e.offset, source="heartbeat")
        for e, (_, _, hb) in zip(t, batch, strict=True)
    ]
    rows = {s: [(f"p{i}", seq, T0 + timedelta(seconds=seq)) for i, seq in stored if i % 2 == s] for s in (0, 1)}

    def fresh() -> Validator:
        v = Validator(timedelta(seconds=3))
        for s in (0, 1):
            v.load_slice(s, T0 + timedelta(seconds=latest), rows[s])
        return v

    one, each = fresh(), fresh()
    accepted: list[EventEnvelope] = []
    expected: list[EventEnvelope] = []
    i = 0
    while i < len(envs):
        stop = one.accept_next(envs, i, accepted, per_pid=per_pid)
        expected_stop = i
        for e in envs[i:]:
            if e.source == "heartbeat" or each.check(e, per_pid=per_pid).verdict is not Verdict.ACCEPT:
                break
            each.record(e)
            expected.append(e)
            expected_stop += 1
        assert stop == expected_stop
        assert one.pending == each.pending
        i = stop + 1  # the caller's full check of envs[stop] (here: skipped)
    assert accepted == expected
