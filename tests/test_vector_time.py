"""VectorTime: merge is a join (commutative, associative, idempotent), <= a partial order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from journal.errors import InvalidArgument
from journal.vector_time import VectorTime

times = st.dictionaries(st.sampled_from(["A", "B", "C", "D"]), st.integers(0, 6), max_size=4).map(VectorTime)


@given(times, times)
def test_merge_is_commutative_and_an_upper_bound(a: VectorTime, b: VectorTime) -> None:
    m = a.merge(b)
    assert m == b.merge(a)
    assert a <= m and b <= m


@given(times, times, times)
def test_merge_is_associative_and_least(a: VectorTime, b: VectorTime, c: VectorTime) -> None:
    assert a.merge(b).merge(c) == a.merge(b.merge(c))
    if a <= c and b <= c:
        assert a.merge(b) <= c


@given(times)
def test_merge_is_idempotent(a: VectorTime) -> None:
    assert a.merge(a) == a


@given(times, times, times)
def test_le_is_a_partial_order(a: VectorTime, b: VectorTime, c: VectorTime) -> None:
    assert a <= a
    if a <= b and b <= a:
        assert a == b
    if a <= b and b <= c:
        assert a <= c


@given(times, times)
def test_exactly_one_relation_holds(a: VectorTime, b: VectorTime) -> None:
    relations = [a == b, a < b, b < a, a.concurrent(b)]
    assert sum(relations) == 1


@given(times, times)
def test_total_extends_the_causal_order(a: VectorTime, b: VectorTime) -> None:
    if a < b:
        assert a.total() < b.total()


def test_examples_and_zero_entries() -> None:
    a = VectorTime({"A": 1})
    b = VectorTime({"A": 1, "B": 1})
    assert a < b and not b < a and not a.concurrent(b)
    assert VectorTime({"A": 2}).concurrent(VectorTime({"B": 1}))
    assert VectorTime({"A": 0}) == VectorTime() and len(VectorTime({"A": 0, "B": 3})) == 1
    assert a.with_entry("C", 4) == VectorTime({"A": 1, "C": 4})
    assert VectorTime.from_json(b.to_json()) == b


@pytest.mark.parametrize("bad", [{"": 1}, {"A": -1}, {"A": 1.5}, {"A": True}])
def test_bad_entries_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidArgument):
        VectorTime(bad)  # type: ignore[arg-type]
