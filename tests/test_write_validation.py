"""The one validator (journal/write_validation.py) gives a bulk call exactly what it gives each
of its parts as a lone call.

``persist_many`` checks and serializes its parts into one batch of columns; whatever it accepts
must be exactly the calls ``persist`` would build (same pids, entity types, slices, numbers,
payloads, tags, metadata), and a part it refuses must raise the error that part raises alone,
naming the part.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal import Write
from journal.errors import InvalidArgument, SerializationError
from journal.serialization import SerializerRegistry
from journal.write_batch import WriteBatch
from journal.write_validation import WriteValidator

MAX = 64
"""write.max_event_bytes for these checks: small, so some generated events are above it."""
VALIDATOR = WriteValidator(SerializerRegistry(), MAX)


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


def _alone(writes: list[Any]) -> list[WriteBatch | Exception]:
    out: list[WriteBatch | Exception] = []
    for w in writes:
        try:
            if not isinstance(w, tuple) or not 2 <= len(w) <= 5:
                raise InvalidArgument("not a Write")
            out.append(VALIDATOR.call(*w))
        except (InvalidArgument, SerializationError) as e:
            out.append(e)
    return out


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.lists(plain, max_size=8), st.lists(st.one_of(plain, plain, plain, parts), max_size=8)))
def test_a_bulk_batch_is_exactly_its_parts_alone(writes: list[Any]) -> None:
    alone = _alone(writes)
    try:
        batch = VALIDATOR.batch(writes)
    except (InvalidArgument, SerializationError) as e:
        bad = next((i for i, a in enumerate(alone) if isinstance(a, Exception)), None)
        if bad is None:  # every part is fine alone: a pid repeats
            assert "appears in an earlier part" in str(e)
            return
        assert type(e) is type(alone[bad]) and f"part {bad}: " in str(e)
        assert str(alone[bad]) in str(e)
        return
    assert not any(isinstance(a, Exception) for a in alone)
    parts = [a for a in alone if isinstance(a, WriteBatch)]
    if not parts:
        assert len(batch) == 0
        return
    assert _columns(batch) == _columns(WriteBatch.concat(parts))


def _columns(b: WriteBatch) -> dict[str, list[Any]]:
    return {f: list(getattr(b, f)) for f in WriteBatch.__struct_fields__}


def test_common_shapes_validate_as_columns() -> None:
    b = VALIDATOR.batch([Write(f"a|{i}", [{"n": i}], i) for i in range(3)])
    assert list(b.persistence_ids) == ["a|0", "a|1", "a|2"] and list(b.expected_seq_nrs) == [0, 1, 2]
    assert list(b.payloads) == [b'{"n":0}', b'{"n":1}', b'{"n":2}'] and list(b.counts) == [1, 1, 1]
    raw = VALIDATOR.batch([(f"a|{i}", (b"x",), 0) for i in range(3)])
    assert list(raw.ser_ids) == [0, 0, 0] and list(raw.payloads) == [b"x"] * 3
    mixed = VALIDATOR.batch([Write("a|1", [1], 0), Write("b|1", [b"x"], 0), Write("c", ["s"], 0)])
    assert list(mixed.entity_types) == ["a", "b", ""]
    appended = VALIDATOR.batch([("a|1", [1, 2]), ("b|1", [3])])
    assert list(appended.expected_seq_nrs) == [None, None] and list(appended.counts) == [2, 1]


@pytest.mark.parametrize(
    ("writes", "error", "message"),
    [
        ([Write("a|1", [1], 0), Write("a|1", [2], 1)], InvalidArgument, "part 1: 'a|1' appears in an earlier part"),
        ([Write("a|1", [1], True)], InvalidArgument, "part 0: expected_seq_nr must be an int"),
        ([Write("a\x00|1", [1], 0)], InvalidArgument, "part 0: persistence id must not contain NUL"),
        (
            [Write("a|1", [1]), Write("a|2", [object()], 0)],
            SerializationError,
            "part 1: cannot serialize event 0 of 'a|2'",
        ),
        ([Write("a|1", [1]), ("a|2",)], InvalidArgument, "part 1: expected a Write"),
        ([("a|1", [1]), ("a|2", [b"x" * (MAX + 1)], 0)], InvalidArgument, "part 1: event 0 of 'a|2' is 65 bytes"),
        ([("a|1", [1]), ("a|2", [1], None, (), "m" * MAX)], InvalidArgument, "part 1: the metadata of 'a|2'"),
        ([("a|1", [1]), ("a|2", [{"when": {1, 2}}], 0)], SerializationError, "part 1: .*a set"),
    ],
)
def test_odd_parts_raise_naming_the_part(writes: list[Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        VALIDATOR.batch(writes)


def test_tags_and_metadata_travel_per_call() -> None:
    b = VALIDATOR.batch([Write("a|1", [1, 2], 0, ("t", "t", "u")), Write("a|2", [3], None, (), {"m": 1})])
    assert list(b.tags) == [("t", "u"), ()]
    assert b.metadata[0] is None and b.metadata[1] is not None and b.metadata[1].payload == b'{"m":1}'


def test_replicated_events_are_checked_by_the_same_rules() -> None:
    """Replication's writes go through the one validator too: what a peer sends is checked like
    any call (a pid may come several times: each event appends after the one before)."""
    from journal.errors import ReplicationError
    from journal.replicated import ReplicatedEvent
    from journal.serialization import Serialized
    from journal.vector_time import VectorTime
    from journal.write_validation import replicated_batch

    def event(pid: str, seq: int, tags: tuple[str, ...] = ()) -> ReplicatedEvent:
        return ReplicatedEvent(pid, Serialized(1, "", b"{}"), "A", seq, VectorTime({"A": seq}), seq, tags)

    b = replicated_batch("Log", [event("Log|1", 1), event("Log|2", 2, ("t", "t")), event("Log|1", 3)])
    assert list(b.persistence_ids) == ["Log|1", "Log|2", "Log|1"] and list(b.expected_seq_nrs) == [None] * 3
    assert list(b.tags) == [(), ("t",), ()] and list(b.counts) == [1, 1, 1]
    with pytest.raises(ReplicationError, match="does not belong to log"):
        replicated_batch("Log", [event("Other|1", 1)])
    with pytest.raises(InvalidArgument, match="NUL"):
        replicated_batch("Log", [event("Log|\x00", 1)])
    with pytest.raises(InvalidArgument, match="tag is 300 characters"):
        replicated_batch("Log", [event("Log|1", 1, ("x" * 300,))])


def test_the_commonest_calls_are_checked_a_column_at_a_time() -> None:
    """The plain shapes take the column checks (which the property test above holds to the
    part-by-part rules); anything else is checked part by part."""
    from journal.write_validation import _plain_calls

    assert _plain_calls([Write(f"a|{i}", [{"n": i}], i) for i in range(3)]) is not None
    assert _plain_calls([(f"a|{i}", (b"x",)) for i in range(3)]) is not None
    assert _plain_calls([(f"a|{i}", [1], None if i % 2 else i) for i in range(4)]) is not None
    for odd in (
        [Write("a|1", [1], True)],
        [Write("a|1", [1], 0, ("t",))],
        [Write("a|1", [1], 0, (), {"m": 1})],
        [Write("a|1", [1], 0), ("a|2", [1], 0)],  # mixed shapes
        [Write("a|1", [1, 2], 0)],
        [Write("a\x00|1", [1], 0)],
        [Write("a|1", [1], -1)],
        [("a|1", [1], 2**63 - 1)],
    ):
        assert _plain_calls(odd) is None, odd
