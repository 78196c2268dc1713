"""ConflictFold: any delivery order that respects causality gives the same state and marks."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from journal.replication.conflicts import ConflictFold, Versioned
from journal.vector_time import VectorTime


def history(writes: list[tuple[str, bool]]) -> list[Versioned]:
    """Events at locations A/B/C; ``sync`` makes a location see everything written so far."""
    seen: dict[str, VectorTime] = {n: VectorTime() for n in "ABC"}
    counters = {n: 0 for n in "ABC"}
    out: list[Versioned] = []
    for i, (loc, sync) in enumerate(writes):
        if sync:
            for e in out:
                seen[loc] = seen[loc].merge(e.vector_time)
        counters[loc] += 1
        vt = seen[loc].with_entry(loc, counters[loc])
        seen[loc] = vt
        out.append(Versioned({"set": i}, vt, loc, counters[loc]))
    return out


def causal_shuffle(events: list[Versioned], picks: list[int]) -> list[Versioned]:
    """A delivery order that respects happened-before, chosen by ``picks``."""
    left, out = list(events), []
    for p in picks + [0] * len(events):
        if not left:
            break
        ready = [e for e in left if not any(o.vector_time < e.vector_time for o in left)]
        e = ready[p % len(ready)]
        left.remove(e)
        out.append(e)
    return out


def register() -> ConflictFold[dict[str, object]]:
    def on_event(s: dict[str, object], e: dict[str, int]) -> dict[str, object]:
        return {**s, "value": e["set"], "n": int(str(s.get("n", 0))) + 1}

    def on_concurrent(s: dict[str, object], v: Versioned, others: Sequence[Versioned]) -> dict[str, object]:
        return {**on_event(s, v.event), "conflicts": int(str(s.get("conflicts", 0))) + 1}

    return ConflictFold(dict, on_event, on_concurrent)


writes = st.lists(st.tuples(st.sampled_from("ABC"), st.booleans()), min_size=1, max_size=12)


@settings(max_examples=200)
@given(writes, st.lists(st.integers(0, 10), max_size=12), st.lists(st.integers(0, 10), max_size=12), st.integers(1, 4))
def test_same_events_same_state_whatever_the_causal_delivery(
    w: list[tuple[str, bool]], p1: list[int], p2: list[int], chunk: int
) -> None:
    events = history(w)
    f1, f2 = register(), register()
    order1, order2 = causal_shuffle(events, p1), causal_shuffle(events, p2)
    for i in range(0, len(order1), chunk):
        f1.add(order1[i : i + chunk])
    f2.add(order2)
    f2.add(order2[:2])  # duplicates are ignored
    assert f1.state == f2.state
    assert [v.concurrent for v in f1.folded] == [v.concurrent for v in f2.folded]
    assert f1.state["n"] == len(events)


def test_concurrent_writes_are_marked_and_last_writer_wins_by_location() -> None:
    a = Versioned({"set": "a"}, VectorTime({"A": 1}), "A", 1)
    b = Versioned({"set": "b"}, VectorTime({"B": 1}), "B", 1)
    after = Versioned({"set": "c"}, VectorTime({"A": 1, "B": 1, "C": 1}), "C", 1)
    fold = ConflictFold(lambda: None, lambda s, e: e["set"])
    fold.add([b])
    fold.add([a])
    assert fold.state == "b"  # same vector-time sum: location id decides
    assert [v.concurrent for v in fold.folded] == [False, True]
    fold.add([after])
    assert fold.state == "c" and not fold.folded[-1].concurrent
    assert fold.vector_time == VectorTime({"A": 1, "B": 1, "C": 1})
