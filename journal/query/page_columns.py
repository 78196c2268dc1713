"""A page of slice-query rows taken a column at a time: every row's offset in one pass, every
payload decoded in one call per page where it can be. What a consumer that wants every row of a
page (the changes by slices) uses instead of the lazy, row-by-row page behind the envelopes.

Rows come in query order, (db_timestamp, seq_nr, pid), with the columns of
:data:`~journal.backend.SLICE_ROW_COLUMNS` in that order (asyncpg records, on one database or
merged from several).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import islice
from typing import Any

from ..backend import SLICE_ROW_COLUMNS
from ..errors import SerializationError
from ..offsets import TimestampOffset
from ..serialization import JSON_SERIALIZER_ID, SerializerRegistry

PID, ENTITY_TYPE, SLICE, SEQ_NR, DB_TIMESTAMP, SER_ID, MANIFEST, PAYLOAD = (
    SLICE_ROW_COLUMNS.index(c)
    for c in (
        "persistence_id", "entity_type", "slice", "seq_nr", "db_timestamp", "event_ser_id", "event_ser_manifest",
        "event_payload",
    )
)  # fmt: skip
"""Positions of the columns a page's consumer reads."""

_trusted = TimestampOffset.trusted


def columns(rows: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The page's columns (``rows`` non-empty): ``columns(rows)[PID]`` is every row's pid."""
    return list(zip(*rows, strict=True))


def offsets(
    base: TimestampOffset | None, timestamps: Sequence[datetime], pids: Sequence[str], seq_nrs: Sequence[int]
) -> list[TimestampOffset]:
    """Every row's offset: its timestamp and the highest seq_nr per pid among the rows at that
    timestamp up to it, plus ``base.seen`` (the offset before the page) while the page is at
    ``base``'s timestamp. The common page, every timestamp its own and not ``base``'s, takes
    one call per column; otherwise one loop."""
    ts0 = timestamps[0]
    distinct = not any(map(operator.eq, timestamps, islice(timestamps, 1, None)))
    utc = {t.tzinfo for t in timestamps} == {UTC}  # as asyncpg gives them
    if distinct and utc and (base is None or base.timestamp != ts0):
        return list(map(_trusted, timestamps, map(dict.fromkeys, zip(pids), seq_nrs)))
    out: list[TimestampOffset] = []
    last = base
    seen: dict[str, int] = {}
    for ts, pid, seq_nr in zip(timestamps, pids, seq_nrs, strict=True):
        if ts.tzinfo is not UTC:
            ts = ts.astimezone(UTC)
        if last is not None and last.timestamp == ts:
            seen = dict(last.seen)  # a new dict: an offset's seen is never changed once given
            seen[pid] = seq_nr  # rows of one pid come in seq_nr order: the later is the higher
        else:
            seen = {pid: seq_nr}
        last = _trusted(ts, seen)
        out.append(last)
    return out


def payloads(serializers: SerializerRegistry, cols: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Every row's payload deserialized (None where the row has none). A page of plain JSON
    payloads (the JSON serializer, no manifest) is parsed in one call per page; anything else,
    or a payload that does not parse, row by row by its serializer (an unreadable payload's
    SerializationError names ``pid#seq_nr``)."""
    data = cols[PAYLOAD]
    if None not in data and set(cols[SER_ID]) == {JSON_SERIALIZER_ID} and not any(cols[MANIFEST]):
        try:
            return list(map(serializers.plain_json_reader(), data))
        except ValueError:  # not JSON: the general path says which row, located
            pass
    deserialize = serializers.deserialize
    out: list[Any] = []
    for pid, seq_nr, ser_id, manifest, payload in zip(
        cols[PID], cols[SEQ_NR], cols[SER_ID], cols[MANIFEST], data, strict=True
    ):
        try:
            out.append(None if payload is None else deserialize(ser_id, manifest, payload, pid=pid))
        except SerializationError as e:
            raise e.located(f"{pid}#{seq_nr}") from e
    return out
