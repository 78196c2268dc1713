"""ConcurrentVersions: the versions no update supersedes, whatever the causal delivery order;
resolve merges vector times; stored and read back through the journal's serializer registry."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal import InvalidArgument, Journal
from journal.replication.concurrent_versions import ConcurrentVersions, Version
from journal.replication.conflicts import Versioned
from journal.vector_time import VectorTime
from tests.test_replication_conflicts import causal_shuffle, history


def vt(**entries: int) -> VectorTime:
    return VectorTime(entries)


def test_a_causally_newer_update_replaces_the_versions_it_dominates() -> None:
    cv = ConcurrentVersions().update("a", vt(A=1), "A").update("b", vt(A=2), "A")
    assert [v.value for v in cv.all] == ["b"]
    assert not cv.conflict


def test_a_concurrent_update_is_kept_beside_and_a_later_one_replaces_both() -> None:
    cv = ConcurrentVersions().update("a", vt(A=1), "A").update("b", vt(B=1), "B")
    assert cv.conflict
    assert {v.value for v in cv.all} == {"a", "b"}
    assert cv.vector_time == vt(A=1, B=1)
    later = cv.update("c", vt(A=1, B=2), "B")
    assert [v.value for v in later.all] == ["c"] and not later.conflict


def test_a_stale_or_repeated_update_is_ignored() -> None:
    cv = ConcurrentVersions().update("new", vt(A=2))
    assert cv.update("old", vt(A=1)) == cv
    assert cv.update("again", vt(A=2)) == cv


def test_resolve_keeps_the_selected_value_under_the_merged_vector_time() -> None:
    cv = ConcurrentVersions().update("a", vt(A=1), "A").update("b", vt(B=1), "B")
    resolved = cv.resolve(vt(B=1))
    assert resolved.all == (Version("b", vt(A=1, B=1), "B"),)
    assert not resolved.conflict
    # the resolving event's own time is merged too, and a late concurrent-looking copy of "a" is dropped
    stamped = cv.resolve({"A": 1}, vt(A=1, B=1, C=3))
    assert stamped.all[0].vector_time == vt(A=1, B=1, C=3)
    assert stamped.update("a", vt(A=1)) == stamped


def test_resolve_of_an_unknown_version_is_refused() -> None:
    cv = ConcurrentVersions().update("a", vt(A=1))
    with pytest.raises(InvalidArgument, match="no concurrent version"):
        cv.resolve(vt(Z=9))


def test_from_json_refuses_another_shape() -> None:
    with pytest.raises(InvalidArgument, match="not a serialized ConcurrentVersions"):
        ConcurrentVersions.from_json({"values": []})


def apply_all(events: list[Versioned]) -> ConcurrentVersions:
    cv = ConcurrentVersions()
    for e in events:
        cv = cv.update(e.event["set"], e.vector_time, e.origin_location)
    return cv


@settings(max_examples=200, deadline=None)
@given(
    writes=st.lists(st.tuples(st.sampled_from("ABC"), st.booleans()), min_size=1, max_size=12),
    picks=st.lists(st.integers(min_value=0, max_value=20), max_size=12),
)
def test_any_causal_delivery_order_gives_the_same_versions(writes: list[tuple[str, bool]], picks: list[int]) -> None:
    events = history(writes)
    in_order = apply_all(events)
    shuffled = apply_all(causal_shuffle(events, picks))
    assert shuffled == in_order
    # the kept versions are exactly the updates no other update happened after
    maximal = {e.event["set"] for e in events if not any(e.vector_time < o.vector_time for o in events)}
    assert {v.value for v in in_order.all} == maximal
    assert in_order.conflict == (len(maximal) > 1)


async def test_stored_and_read_back_through_the_serializer_registry(journal: Journal) -> None:
    cv = ConcurrentVersions().update({"n": 1}, vt(A=1), "A").update({"n": 2}, vt(B=1), "B")
    journal.serializers.register_type(ConcurrentVersions)
    ser = journal.serializers.serialize(cv)
    assert ser.manifest.endswith(":ConcurrentVersions")
    await journal.persist("register|x", [cv])
    [env] = [e async for e in journal.current_events_by_persistence_id("register|x")]
    assert isinstance(env.event, ConcurrentVersions)
    assert env.event == cv and env.event.conflict
    await journal.save_snapshot("register|x", 1, cv)
    snap = await journal.load_snapshot("register|x")
    assert snap is not None and snap.state == cv


def test_a_replicated_state_offers_its_events_as_concurrent_versions() -> None:
    from journal.replication.conflicts import ConflictFold
    from journal.replication.entity import ReplicatedState

    fold: ConflictFold[list[str]] = ConflictFold(list, lambda s, e: [*s, e])
    fold.add([Versioned("a", vt(A=1), "A", 1), Versioned("b", vt(A=1, B=1), "B", 1), Versioned("c", vt(A=2), "A", 2)])
    state = ReplicatedState(fold.state, fold.vector_time, tuple(fold.folded))
    cv = state.concurrent_versions(str.upper)
    assert {(v.value, v.creator) for v in cv.all} == {("B", "B"), ("C", "A")} and cv.conflict
