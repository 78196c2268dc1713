"""The column fast path of persist_many agrees with the general path on every input.

``bulk_columns`` checks parts a column at a time; whatever it accepts must be exactly the
requests ``bulk_requests`` builds (same pids, entity types, slices, numbers, payloads), and
anything odd (tags, metadata, a repeated pid, a bool, a NUL, a wrong shape) must fall back.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from journal import Write
from journal.bulk import bulk_columns, bulk_requests
from journal.errors import InvalidArgument, SerializationError
from journal.serialization import SerializerRegistry

SERIALIZERS = SerializerRegistry()
MAX = 64
"""write.max_event_bytes for these checks: small, so some generated events are above it."""


def _full(*_: Any) -> Any:
    raise InvalidArgument("not a plain part")


pids = st.one_of(
    st.sampled_from(["a|1", "a|2", "b|1", "plain", "a|x|y", "|lead", "", "a\x00|1", "x" * 256]),
    st.text(max_size=8),
    st.integers(),
)
events = st.one_of(
    st.lists(st.one_of(st.integers(), st.text(max_size=3), st.binary(max_size=3), st.booleans()), max_size=2),
    st.tuples(st.dictionaries(st.text(max_size=2), st.integers(), max_size=2)),
    st.just("not a list"),
)
expected = st.one_of(st.integers(min_value=-1, max_value=5), st.just(2**63 - 1), st.booleans(), st.none())
parts = st.one_of(
    st.tuples(pids, events, expected).map(lambda t: Write(*t)),
    st.tuples(pids, events, expected, st.sampled_from([(), ("t",)]), st.sampled_from([None, {"m": 1}])).map(
        lambda t: Write(*t)
    ),
    st.tuples(pids, events, expected),
    st.tuples(pids, events),
)


plain_pids = st.text(alphabet="ab|", min_size=1, max_size=5)
plain_events = st.lists(
    st.one_of(st.integers(), st.text(max_size=3), st.binary(max_size=3), st.binary(min_size=MAX - 2, max_size=MAX + 2)),
    min_size=1, max_size=1,
)  # fmt: skip
plain = st.one_of(
    st.tuples(plain_pids, plain_events, st.integers(min_value=0, max_value=9)).map(lambda t: Write(*t)),
    st.tuples(plain_pids, plain_events, st.integers(min_value=0, max_value=9)),
)


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.lists(plain, max_size=8), st.lists(st.one_of(plain, plain, plain, parts), max_size=8)))
def test_columns_are_exactly_the_requests_or_none(writes: list[Any]) -> None:
    columns = bulk_columns(writes, SERIALIZERS, MAX)
    if columns is None:
        return
    requests = bulk_requests(writes, SERIALIZERS, _full, MAX)
    c = columns
    got = zip(c.persistence_ids, c.entity_types, c.slices, c.expected_seq_nrs, c.ser_ids, c.payloads, strict=True)
    assert list(got) == [
        (r.persistence_id, r.entity_type, r.slice, r.expected_seq_nr, r.events[0].ser_id, r.events[0].payload)
        for r in requests
    ]
    assert all(len(r.events) == 1 and not r.tags and r.metadata is None for r in requests)


def test_common_shapes_take_the_columns() -> None:
    assert bulk_columns([Write(f"a|{i}", [{"n": i}], i) for i in range(3)], SERIALIZERS, MAX) is not None
    assert bulk_columns([(f"a|{i}", (b"x",), 0) for i in range(3)], SERIALIZERS, MAX) is not None
    mixed = bulk_columns([Write("a|1", [1], 0), Write("b|1", [b"x"], 0), Write("c", ["s"], 0)], SERIALIZERS, MAX)
    assert mixed is not None and mixed.entity_types == ["a", "b", ""]


def test_odd_parts_fall_back() -> None:
    for writes in (
        [Write("a|1", [1], 0), Write("a|1", [2], 1)],  # a pid twice
        [Write("a|1", [1], True)],  # a bool is not a sequence number
        [Write("a|1", [1], 0, ("t",))],
        [Write("a|1", [1], 0, (), {"m": 1})],
        [Write("a|1", [1], 0), ("a|2", [1], 0)],  # mixed shapes
        [Write("a|1", [1, 2], 0)],
        [Write("a\x00|1", [1], 0)],
        [Write("a|1", [object()], 0)],
        [Write("a|1", [b"x" * (MAX + 1)], 0)],  # above write.max_event_bytes
        [Write("a|1", [{"when": {1, 2}}], 0)],  # does not read back unchanged
    ):
        assert bulk_columns(writes, SERIALIZERS, MAX) is None, writes
        try:
            bulk_requests(writes, SERIALIZERS, _full, MAX)
        except (InvalidArgument, SerializationError):
            pass
