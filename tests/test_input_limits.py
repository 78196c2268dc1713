"""Bad input at the edges of the numeric range and of the offset types: a typed error before I/O."""

from __future__ import annotations

import asyncpg
import pytest

from journal import InvalidArgument, Journal, OffsetError, TimestampOffset
from journal.offsets import SequenceOffset

MAX = 2**63 - 1


async def _rows(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM event_journal"))
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("expected", "events"),
    [(2**63, [1]), (2**64, [1]), (MAX, [1]), (MAX - 1, [1, 2])],
)
async def test_expected_seq_nr_beyond_bigint_is_invalid_argument(
    dsn: str, journal: Journal, expected: int, events: list[int]
) -> None:
    with pytest.raises(InvalidArgument, match="expected_seq_nr"):
        await journal.persist("big|1", events, expected_seq_nr=expected)
    assert await _rows(dsn) == 0


async def test_the_last_sequence_number_itself_is_accepted_as_a_bound(journal: Journal) -> None:
    await journal.persist("big|2", [1, 2])
    await journal.delete_events_to("big|2", MAX)  # a bound, not a row: fine up to the maximum
    assert [e async for e in journal.current_events_by_persistence_id("big|2", 1, MAX)] == []
    assert await journal.highest_seq_nr("big|2") == 2


async def test_sequence_numbers_beyond_bigint_on_reads_and_deletes(dsn: str, journal: Journal) -> None:
    await journal.persist("big|3", [1])
    with pytest.raises(InvalidArgument, match="to_seq_nr"):
        await journal.delete_events_to("big|3", 2**64)
    with pytest.raises(InvalidArgument, match="to_seq_nr"):
        await journal.delete_events_to("big|3", 2**63)
    with pytest.raises(InvalidArgument, match="from_seq_nr"):
        [e async for e in journal.current_events_by_persistence_id("big|3", 2**63)]
    with pytest.raises(InvalidArgument, match="to_seq_nr"):
        [e async for e in journal.current_events_by_persistence_id("big|3", 1, 2**64)]
    with pytest.raises(InvalidArgument, match="from_seq_nr"):
        journal.events_by_persistence_id("big|3", 2**63)
    with pytest.raises(InvalidArgument, match="seq_nr"):
        await journal.timestamp_of("big|3", 2**63)
    assert await _rows(dsn) == 1


@pytest.mark.parametrize(
    ("offset", "named"),
    [("2024-01-01", "str"), ({"timestamp": 1}, "dict"), (17, "int"), (SequenceOffset(3), "SequenceOffset")],
)
async def test_offset_error_names_the_type_received(journal: Journal, offset: object, named: str) -> None:
    with pytest.raises(OffsetError) as info:
        journal.current_events_by_slices("x", 0, 5, offset)  # type: ignore[arg-type]
    msg = str(info.value)
    assert f"got {named}" in msg
    assert ("SequenceOffset" in msg) == (named == "SequenceOffset"), msg
    assert TimestampOffset.__name__ in msg
