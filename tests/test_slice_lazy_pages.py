"""Lazily built envelopes of a catch-up page equal what the eager path gives, row by row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from journal.backend import SLICE_ROW_COLUMNS, stored_event
from journal.envelope import EventEnvelope
from journal.errors import SerializationError
from journal.offsets import TimestampOffset
from journal.query.slice_query import SliceQueryState
from journal.query.slices import _Page
from journal.serialization import SerializerRegistry

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def row(pid: str, seq: int, ms: int, payload: bytes | None = b'{"n": 1}', **more: object) -> dict[str, object]:
    """A page row as the slice reads give it: read by the column names of SLICE_ROW_COLUMNS."""
    ts = T0 + timedelta(milliseconds=ms)
    values = (pid, "e", 0, seq, ts, 1, "", payload, "w", None, None, None, None, False)
    return {**dict(zip(SLICE_ROW_COLUMNS, values, strict=True)), **more}


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 3)), min_size=1, max_size=30),
       st.booleans(), st.permutations(range(30)))  # fmt: skip
def test_lazy_offsets_equal_the_state_machine(
    spec: list[tuple[str, int]], base_at_first: bool, order: list[int]
) -> None:
    seqs: dict[str, int] = {}
    rows = []
    for pid, ms in sorted(spec, key=lambda x: x[1]):
        seqs[pid] = seqs.get(pid, 0) + 1
        rows.append(row(pid, seqs[pid], ms))
    rows.sort(key=lambda r: (r["db_timestamp"], r["seq_nr"], r["persistence_id"]))  # type: ignore[return-value]
    base = TimestampOffset(rows[0]["db_timestamp"], {"z": 7, "a": 0}) if base_at_first else None  # type: ignore[arg-type]
    eager = SliceQueryState(base, 100)
    expected = [eager.offset_for(stored_event(r)) for r in rows]
    page = _Page(list(rows), base, SerializerRegistry())
    got: dict[int, TimestampOffset] = {}
    for i in [i for i in order if i < len(rows)]:  # any access order, with repeats of the memo path
        got[i] = page.offset_at(i)
    for i in range(len(rows)):
        got.setdefault(i, page.offset_at(i))
        assert got[i] == expected[i]
        assert page.offset_at(i) == expected[i]


def test_lazy_envelope_decodes_on_access_and_compares_like_an_eager_one() -> None:
    from journal.envelope import page_envelopes

    rows = [row("a", 1, 0), row("a", 2, 0, b"not json")]
    page = _Page(rows, None, SerializerRegistry())
    envs = page_envelopes(rows, page, page.metadata)
    eager = EventEnvelope("a", "e", 0, 1, rows[0]["db_timestamp"], {"n": 1}, page.offset_at(0), writer="w")  # type: ignore[arg-type]
    assert envs[0] == eager and repr(envs[0]) == repr(eager)
    assert envs[0].event == {"n": 1} and envs[0].offset == TimestampOffset(T0, {"a": 1})
    with pytest.raises(SerializationError, match="a#2"):
        _ = envs[1].event
    assert envs[1].offset == TimestampOffset(T0, {"a": 2})


def test_page_envelopes_read_the_row_and_look_like_eager_ones() -> None:
    import copy

    from journal.envelope import page_envelopes

    rows = [row("a", 1, 0), row("b", 1, 0, None, writer="w2", tags=["t1"])]
    page = _Page(rows, None, SerializerRegistry())
    got = page_envelopes(rows, page, page.metadata)
    eager = [
        EventEnvelope("a", "e", 0, 1, T0, {"n": 1}, TimestampOffset(T0, {"a": 1}), writer="w"),
        EventEnvelope("b", "e", 0, 1, T0, None, TimestampOffset(T0, {"a": 1, "b": 1}), ("t1",),
                      writer="w2", has_payload=False),
    ]  # fmt: skip
    assert got == eager and eager == got
    assert [repr(e) for e in got] == [repr(e) for e in eager]
    b = got[1]
    assert (b.persistence_id, b.seq_nr, b.db_timestamp, b.writer, b.has_payload, b.source, b.tags) == (
        "b",
        1,
        T0,
        "w2",
        False,
        "query",
        ("t1",),
    )
    for e in got:
        assert copy.copy(e) == e
        cls, values = e.__reduce__()  # pickling rebuilds a plain EventEnvelope
        assert cls is EventEnvelope and cls(*values) == e
        with pytest.raises(AttributeError):
            e.seq_nr = 5  # type: ignore[misc]
    match got[0]:
        case EventEnvelope("a", "e", 0, 1, _, {"n": 1}):
            pass
        case _:
            pytest.fail("positional match on a page envelope")


def test_written_envelopes_are_frozen_eager_looking_envelopes() -> None:
    """``EventEnvelope.written`` makes each offset when asked for: the result must be
    indistinguishable from one built by the constructor, and frozen."""
    import copy
    import pickle

    from journal.envelope import ROW_STEP
    from journal.offsets import SequenceOffset

    ts = datetime(2026, 1, 2, tzinfo=UTC)
    got = EventEnvelope.written("cart|1", "cart", 7, 4, ts, [{"a": 1}, "b"], ("t",), {"m": 1}, "w")
    want = [  # events of one call are stamped one microsecond apart
        EventEnvelope("cart|1", "cart", 7, n, ts + (n - 4) * ROW_STEP, ev, SequenceOffset(n), ("t",), {"m": 1}, "w")
        for n, ev in ((4, {"a": 1}), (5, "b"))
    ]
    assert got == want and all(isinstance(e, EventEnvelope) for e in got)
    assert repr(got[1]) == repr(want[1])
    assert pickle.loads(pickle.dumps(got[1])) == want[1] and copy.deepcopy(got[0]) == want[0]
    with pytest.raises(AttributeError):
        got[0].seq_nr = 9  # type: ignore[misc]
    assert got[0].offset == SequenceOffset(4)
