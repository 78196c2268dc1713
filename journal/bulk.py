"""The bulk write API's value types: one :class:`Write` per persistence id in, one
:class:`Written` or typed error per part out (see :meth:`journal.Journal.persist_many`).

Results are plain tuples rather than envelopes: a bulk caller writing thousands of parts reads
the sequence numbers and the timestamp, and building an envelope per event would cost about as
much as writing it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from itertools import repeat
from typing import Any, NamedTuple

from .backend import WriteRequest, WriteResult, new_row
from .columns import WriteColumns
from .errors import InvalidArgument, JournalError, SerializationError, StorageError
from .ids import ENTITY_TYPE_SEPARATOR, MAX_PERSISTENCE_ID_LENGTH, MAX_SEQ_NR, entity_type_of, slice_for
from .serialization import (
    BYTES_SERIALIZER_ID,
    JSON_SERIALIZER_ID,
    Serialized,
    SerializerRegistry,
    dump_plain_json,
    dump_plain_jsons,
)


class Write(NamedTuple):
    """One part of :meth:`~journal.Journal.persist_many`: what one ``persist`` call would take.

    ``expected_seq_nr`` is the highest sequence number the caller believes is stored for the
    pid (None: append after whatever is stored).
    """

    persistence_id: str
    events: Sequence[Any]
    expected_seq_nr: int | None = None
    tags: Sequence[str] = ()
    metadata: Any = None


class Written(NamedTuple):
    """A part that was written: its events got ``first_seq_nr..last_seq_nr`` and one timestamp."""

    persistence_id: str
    first_seq_nr: int
    last_seq_nr: int
    db_timestamp: datetime


Outcome = Written | JournalError
"""Per part: :class:`Written`, or the error that part alone got (nothing of it was written,
except for ``JournalUnavailable(outcome_unknown=True)``, which says it may have been)."""


def failures(outcomes: Sequence[Outcome]) -> list[tuple[int, JournalError]]:
    """The failed parts of a :meth:`~journal.Journal.persist_many` result, as (index, error)."""
    return [(i, o) for i, o in enumerate(outcomes) if isinstance(o, JournalError)]


MAX_EVENTS_PER_CALL = 10_000
"""At most this many events in one ``persist`` call or one ``persist_many`` part."""

FullRequest = Callable[[str, Sequence[Any], "int | None", Sequence[str], Any], WriteRequest]
"""Validates one part in full and builds its request, or raises (``Journal._request``)."""


def bulk_columns(
    writes: Sequence[Write | tuple[Any, ...]], serializers: SerializerRegistry, max_bytes: int
) -> WriteColumns | None:
    """The parts of a ``persist_many`` call as columns, when every part is one plain event (a
    plain JSON value or bytes, at most ``max_bytes`` serialized) with an int ``expected_seq_nr``,
    no tags and no metadata, and no pid repeats; else None (then :func:`bulk_requests` checks every
    part and raises for a bad one).

    The parts are transposed and checked a column at a time (``zip``, ``map``, ``set``: loops
    that run in C), so the common call costs little more per part than the serialization.
    """
    n = len(writes)
    if not n:
        return None
    kinds = set(map(type, writes))
    if kinds == {Write}:
        pids, events, expected, tags, metadata = zip(*writes, strict=True)
        if any(tags) or metadata.count(None) != n:
            return None
    elif kinds == {tuple} and set(map(len, writes)) == {3}:
        pids, events, expected = zip(*writes, strict=True)
    else:
        return None
    if set(map(type, pids)) != {str} or set(map(type, expected)) != {int}:
        return None
    if not 0 <= min(expected) <= max(expected) < MAX_SEQ_NR:
        return None
    lengths = set(map(len, pids))
    if min(lengths) == 0 or max(lengths) > MAX_PERSISTENCE_ID_LENGTH or "\x00" in "".join(pids):
        return None
    if not set(map(type, events)) <= _LIST_OR_TUPLE or set(map(len, events)) != {1}:
        return None
    if len(set(pids)) != n:
        return None
    evs: list[Any] = [e for (e,) in events]
    types = set(map(type, evs))
    try:
        if types <= serializers.plain_json_types:
            payloads: list[bytes] = dump_plain_jsons(evs)
            ser_ids = [JSON_SERIALIZER_ID] * n
        elif types <= serializers.plain_json_types | {serializers.plain_bytes_type}:
            raw = serializers.plain_bytes_type
            payloads = [ev if type(ev) is raw else dump_plain_json(ev) for ev in evs]  # type: ignore[misc]
            ser_ids = [BYTES_SERIALIZER_ID if type(ev) is raw else JSON_SERIALIZER_ID for ev in evs]
        else:
            return None
    except Exception:  # a value that does not serialize: bulk_requests raises the error naming it
        return None
    if max(map(len, payloads)) > max_bytes:
        return None
    return WriteColumns(list(pids), _entity_types(pids), list(map(slice_for, pids)), list(expected), payloads, ser_ids)


_LIST_OR_TUPLE = frozenset({list, tuple})


def _entity_types(pids: Sequence[str]) -> list[str]:
    """Each pid's entity type; in one pass of C when every pid has the first one's (the
    common bulk call: one entity type)."""
    first = pids[0]
    cut = first.find(ENTITY_TYPE_SEPARATOR)
    if cut >= 0:
        prefix = first[: cut + 1]  # holds one separator, its last character
        if sum(map(str.startswith, pids, repeat(prefix))) == len(pids):
            return [first[:cut]] * len(pids)
    return list(map(entity_type_of, pids))


def column_outcomes(columns: WriteColumns, results: Sequence[datetime | WriteResult | Exception]) -> list[Outcome]:
    """:func:`outcomes` of a bulk write sent as columns."""
    firsts = [e + 1 for e in columns.expected_seq_nrs]
    if set(map(type, results)) == {datetime}:  # every call written as a column: no loop in Python
        rows = zip(columns.persistence_ids, firsts, firsts, results, strict=True)
        written: list[Outcome] = list(map(new_row, repeat(Written), rows))
        return written
    out: list[Outcome] = []
    append = out.append
    for pid, first, res in zip(columns.persistence_ids, firsts, results, strict=True):
        if type(res) is datetime:
            append(new_row(Written, (pid, first, first, res)))
        elif type(res) is WriteResult:
            append(Written(pid, res.first_seq_nr, res.first_seq_nr, res.db_timestamp))
        else:
            append(_failed_pid(pid, res))
    return out


def bulk_requests(
    writes: Iterable[Write | tuple[Any, ...]], serializers: SerializerRegistry, full: FullRequest, max_bytes: int
) -> list[WriteRequest]:
    """The requests of a ``persist_many`` call, built in one tight loop.

    The common part (a ``str`` pid, a list or tuple of plain JSON values or bytes, an int or no
    ``expected_seq_nr``, no tags, no metadata) is checked and serialized inline; any other part
    goes through ``full``, which checks it completely and raises the typed error. Raises
    InvalidArgument or SerializationError naming the part's index, or for a pid in two parts.
    """
    plain = serializers.plain_json_types
    raw = serializers.plain_bytes_type
    requests: list[WriteRequest] = []
    append = requests.append
    for i, w in enumerate(writes):
        try:
            if type(w) is not Write:
                w = _as_write(w)
            pid, events, expected, tags, metadata = w
            append(plain_request(pid, events, expected, tags, metadata, plain, raw, max_bytes) or full(*w))
        except (InvalidArgument, SerializationError) as e:
            raise type(e)(f"persist_many part {i}: {e}") from e
    pids = [r.persistence_id for r in requests]
    if len(set(pids)) != len(pids):
        seen: set[str] = set()
        for i, pid in enumerate(pids):
            if pid in seen:
                raise InvalidArgument(f"persist_many part {i}: {pid!r} appears in an earlier part; one part per pid")
            seen.add(pid)
    return requests


def plain_request(
    pid: Any,
    events: Any,
    expected: Any,
    tags: Any,
    metadata: Any,
    plain: frozenset[type],
    raw: type | None,
    max_bytes: int,
) -> WriteRequest | None:
    """The request of a common call (a ``str`` pid, a list or tuple of plain JSON values or
    bytes of at most ``max_bytes`` serialized, an int or no ``expected_seq_nr``, no tags, no
    metadata), checked and serialized inline; None for any other call, which the caller checks in
    full (and which raises there)."""
    if (
        type(pid) is str
        and 0 < len(pid) <= MAX_PERSISTENCE_ID_LENGTH
        and (type(events) is list or type(events) is tuple)
        and 0 < len(events) <= MAX_EVENTS_PER_CALL
        and (expected is None or (type(expected) is int and 0 <= expected <= MAX_SEQ_NR - len(events)))
        and not tags
        and metadata is None
        and "\x00" not in pid
    ):
        if len(events) == 1 and type(events[0]) in plain:  # the commonest call
            try:
                payload = dump_plain_json(events[0])
            except Exception:  # the full path raises the error that names it
                return None
            if len(payload) > max_bytes:
                return None
            serialized: list[Serialized] | None = [new_row(Serialized, (JSON_SERIALIZER_ID, "", payload))]
        else:
            serialized = _plain_events(events, plain, raw, max_bytes)
        if serialized is not None:
            cut = pid.find(ENTITY_TYPE_SEPARATOR)
            et = pid[:cut] if cut >= 0 else ""
            request: WriteRequest = new_row(WriteRequest, (pid, et, slice_for(pid), expected, serialized, (), None))
            return request
    return None


def _plain_events(
    events: Sequence[Any], plain: frozenset[type], raw: type | None, max_bytes: int
) -> list[Serialized] | None:
    """The serialized events of a common part, or None to take the full path (also when a value
    does not serialize or is too large: the full path raises the error that names it)."""
    try:
        if set(map(type, events)) <= plain:  # the common part: serialized and read back in loops in C
            payloads = dump_plain_jsons(events if type(events) is list else list(events))
            if max(map(len, payloads)) > max_bytes:
                return None
            return [Serialized(JSON_SERIALIZER_ID, "", p) for p in payloads]
        out: list[Serialized] = []
        for ev in events:
            t = type(ev)
            if t in plain:
                out.append(Serialized(JSON_SERIALIZER_ID, "", dump_plain_json(ev)))
            elif t is raw:
                out.append(Serialized(BYTES_SERIALIZER_ID, "", ev))
            else:
                return None
            if len(out[-1].payload) > max_bytes:
                return None
        return out
    except Exception:
        return None


def _as_write(w: object) -> Write:
    if not isinstance(w, tuple) or not 2 <= len(w) <= 5:
        raise InvalidArgument(
            f"expected a Write or a (pid, events[, expected_seq_nr, tags, metadata]) tuple, got {w!r:.80}"
        )
    return Write(*w)


def outcomes(requests: Sequence[WriteRequest], results: Sequence[WriteResult | Exception]) -> list[Outcome]:
    """The caller's view of a bulk write's results: :class:`Written` per part, or its error."""
    return [
        Written(r.persistence_id, res.first_seq_nr, res.first_seq_nr + len(r.events) - 1, res.db_timestamp)
        if type(res) is WriteResult
        else _failed(r, res)
        for r, res in zip(requests, results, strict=True)
    ]


def _failed(r: WriteRequest, res: WriteResult | Exception) -> JournalError:
    return _failed_pid(r.persistence_id, res)


def _failed_pid(pid: str, res: object) -> JournalError:
    if isinstance(res, JournalError):
        return res
    err = StorageError(f"write of {pid!r} failed: {type(res).__name__}: {res}")
    err.__cause__ = res if isinstance(res, BaseException) else None
    return err
