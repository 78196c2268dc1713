"""The partition layout of ``messages``, simulated without a server: every write placed as the
backend places it, every read driven by the backend's cursor, from every from_seq_nr.

(The same scenarios run against a real node in test_cassandra_features.py.)"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from journal.cassandra.partitions import PartitionCursor, PartitionLayout
from journal.errors import InvalidArgument

Store = dict[int, list[int]]


def write(store: Store, lay: PartitionLayout, first: int, n: int) -> None:
    store.setdefault(lay.write_partition(first), []).extend(range(first, first + n))


def write_reference(store: Store, lay: PartitionLayout, first: int, n: int) -> None:
    """How the reference's plugin places a call: the partition of its last event."""
    store.setdefault(lay.partition_nr(first + n - 1), []).extend(range(first, first + n))


def replay(store: Store, lay: PartitionLayout, from_seq_nr: int, page: int = 10**9) -> list[int]:
    cursor = PartitionCursor(lay, from_seq_nr)
    out: list[int] = []
    while cursor.more():
        got = [s for s in store.get(cursor.partition, []) if s >= cursor.next_seq_nr][:page]
        out.extend(got)
        cursor.advance(got[-1] if got else None)
    return out


def highest(store: Store, lay: PartitionLayout, after: int = 0) -> int:
    cursor = PartitionCursor(lay, after + 1)
    while cursor.more():
        got = store.get(cursor.partition, [])
        cursor.advance(max(got) if got else None)
    return cursor.next_seq_nr - 1


@given(
    size=st.integers(1, 6),
    reference_calls=st.lists(st.integers(1, 6), max_size=8),
    calls=st.lists(st.integers(1, 6), min_size=1, max_size=25),
)
def test_replay_from_every_seq_nr_returns_exactly_the_rest(
    size: int, reference_calls: list[int], calls: list[int]
) -> None:
    """A pid first written by the reference's plugin (a service moving over), then by this one."""
    lay = PartitionLayout(size)
    store: Store = {}
    first = 1
    for i, n in enumerate(reference_calls + calls):
        n = min(n, size)  # a call holds at most target_partition_size events
        (write_reference if i < len(reference_calls) else write)(store, lay, first, n)
        first += n
    top = first - 1
    assert highest(store, lay) == top
    for start in range(1, top + 2):
        assert replay(store, lay, start) == list(range(start, top + 1)), (start, store)


def test_a_call_that_crosses_a_boundary_stays_in_one_partition_and_replays_from_inside() -> None:
    lay = PartitionLayout(3)
    store: Store = {}
    write(store, lay, 1, 2)  # 1,2 -> partition 1
    write(store, lay, 3, 3)  # 3,4,5 cross the boundary after 3 -> one partition (1)
    write(store, lay, 6, 1)  # 6 -> partition 2
    assert store == {1: [1, 2, 3, 4, 5], 2: [6]}
    assert replay(store, lay, 4) == [4, 5, 6]  # the partition of the first event would have started at 6


def test_the_first_version_placement_lost_events_on_replay() -> None:
    """Placing a call in the partition of its FIRST event (the earlier code) puts 4 and 5 where a
    reader starting at partition_nr(4) never looks: the suspected bug, reproduced."""
    lay = PartitionLayout(3)
    store: Store = {0: [1, 2, 3, 4, 5], 1: [6]}
    assert replay(store, lay, 4) == [6]


def test_a_call_larger_than_a_partition_is_refused() -> None:
    lay = PartitionLayout(3)
    lay.check_call("A|1", 3)
    with pytest.raises(InvalidArgument, match="at most target_partition_size=3"):
        lay.check_call("A|1", 4)


def test_deletes_cover_the_next_partition() -> None:
    lay = PartitionLayout(3)
    assert list(lay.delete_partitions(1, 3)) == [0, 1]  # 3 is in partition 0 or 1
    assert list(lay.delete_partitions(4, 9)) == [1, 2, 3]
