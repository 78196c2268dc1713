"""The write path's one validator: every kind of call checked and serialized into a
:class:`~journal.write_batch.WriteBatch`.

``persist``, ``persist_in`` and ``resolve_persist`` (one call), ``persist_many`` (its parts, a
chunk at a time) and the entity cell (through ``persist``) all go through
:meth:`WriteValidator.batch`, so a rule is written once and a bad call raises the same typed
error, naming what is wrong, whichever way it came: before anything is written.

The common call (a ``str`` pid, a list of plain JSON values or bytes, an int or no
``expected_seq_nr``, no tags, no metadata) passes each check with one comparison; anything else
falls through to the check that names the fault (:mod:`journal.ids`) or serializes it in full
(:class:`~journal.serialization.SerializerRegistry`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain, repeat
from typing import Any, cast

from .errors import InvalidArgument, ReplicationError, SerializationError
from .ids import (
    ENTITY_TYPE_SEPARATOR,
    MAX_PERSISTENCE_ID_LENGTH,
    MAX_SEQ_NR,
    slice_for,
    slices_for,
    validate_persistence_id,
    validate_seq_nr,
    validate_tags,
)
from .replicated import ReplicatedEvent
from .serialization import Serialized, SerializerRegistry
from .settings import WriteSettings
from .write_batch import WriteBatch

MAX_EVENTS_PER_CALL = 10_000
"""At most this many events in one ``persist`` call or one ``persist_many`` part."""

Checked = tuple[str, str, int, "int | None", int, tuple[str, ...], "Serialized | None"]
"""One call checked: pid, entity type, slice, expected_seq_nr, event count, tags, serialized metadata."""


class WriteValidator:
    """Checks and serializes calls with one serializer registry (see the module docstring);
    ``max_event_bytes``: the largest event (or a call's metadata) once serialized
    (``write.max_event_bytes``)."""

    def __init__(self, serializers: SerializerRegistry, max_event_bytes: int = WriteSettings.max_event_bytes) -> None:
        self.serializers = serializers
        self.max_event_bytes = max_event_bytes

    def call(self, pid: Any, events: Any, expected: Any = None, tags: Any = (), metadata: Any = None) -> WriteBatch:
        """One ``persist`` call as a batch of one."""
        pid, et, sl, expected, n, tags, meta = self.check(pid, events, expected, tags, metadata)
        ser_ids, manifests, payloads = self.serializers.serialize_events(events, pid)
        limit = self.max_event_bytes
        if (len(payloads[0]) if n == 1 else max(map(len, payloads))) > limit or (meta and len(meta.payload) > limit):
            raise self._too_large(pid, payloads, meta)  # type: ignore[misc]  # one is too large
        return WriteBatch((pid,), (et,), (sl,), (expected,), (n,), payloads, ser_ids, manifests, (tags,), (meta,))

    def batch(self, parts: Sequence[object]) -> WriteBatch:
        """The parts of a ``persist_many`` call (``Write`` values or plain tuples of its fields) as
        one batch. Raises InvalidArgument or SerializationError for the first bad part, naming its
        index; a pid in two parts is refused after every part's own faults."""
        return WriteBatch.concat(list(self.chunks(parts, max(1, len(parts))))) if parts else _EMPTY

    def chunks(self, parts: Sequence[object], size: int) -> Iterator[WriteBatch]:
        """:meth:`batch` a chunk of ``size`` parts at a time, each checked and serialized only
        when asked for: a bulk write checks the next chunk while the database writes the ones
        before. The iterator raises where :meth:`batch` would; nothing it yielded may be kept
        then (the bulk write rolls them back)."""
        seen: set[str] = set()
        repeated: int | None = None
        for start in range(0, len(parts), size):
            chunk = self._chunk(parts[start : start + size], start)
            pids = chunk.persistence_ids
            if repeated is None and (len(set(pids)) != len(pids) or not seen.isdisjoint(pids)):
                repeated = start + _first_repeat(pids, seen)
            seen.update(pids)
            if repeated is None:
                yield chunk
        if repeated is not None:  # refused once every part was checked
            pid = parts[repeated][0]  # type: ignore[index]
            raise InvalidArgument(f"persist_many part {repeated}: {pid!r} appears in an earlier part; one part per pid")

    def _chunk(self, parts: Sequence[object], offset: int) -> WriteBatch:
        """Consecutive parts checked, their events serialized in one loop: a column at a time
        when every part is the commonest call (:func:`_plain_calls`), else one by one."""
        return self._plain_chunk(parts) or self._checked_chunk(parts, offset)

    def _plain_chunk(self, parts: Sequence[object]) -> WriteBatch | None:
        plain = _plain_calls(parts)
        if plain is None:
            return None
        pids, expected, events = plain
        try:
            ser_ids, manifests, payloads = self.serializers.serialize_events(events, pids)
        except SerializationError:
            return None  # checked one by one, which names the part
        if max(map(len, payloads)) > self.max_event_bytes:
            return None
        n = len(pids)
        return WriteBatch(
            pids, entity_types_of(pids), slices_for(pids), expected, [1] * n, payloads, ser_ids, manifests,
            ((),) * n, (None,) * n,
        )  # fmt: skip

    def _checked_chunk(self, parts: Sequence[object], offset: int) -> WriteBatch:
        """Parts checked one by one (the rules of :func:`_call`), raising for the first bad one."""
        checked: list[Checked] = []
        events: list[Sequence[Any]] = []
        check = self.check
        for i, w in enumerate(parts, offset):
            try:
                if not isinstance(w, tuple) or not 2 <= len(w) <= 5:
                    raise InvalidArgument(
                        f"expected a Write or a (pid, events[, expected_seq_nr, tags, metadata]) tuple, got {w!r:.80}"
                    )
                checked.append(check(*w))
            except (InvalidArgument, SerializationError) as e:
                self._first_fault(
                    [c[0] for c in checked], events, [c[6] for c in checked], offset
                )  # an earlier one first
                raise type(e)(f"persist_many part {i}: {e}") from e
            events.append(w[1])
        pids, types, slices, expected, counts, tags, metas = zip(*checked, strict=True)
        owners: Sequence[str] = pids
        if counts.count(1) == len(counts):
            flat = [e for (e,) in events]
        else:
            flat, owners = (
                list(chain.from_iterable(events)),
                [p for p, n in zip(pids, counts, strict=True) for _ in range(n)],
            )
        try:
            ser_ids, manifests, payloads = self.serializers.serialize_events(flat, owners)
        except SerializationError:
            self._first_fault(pids, events, metas, offset)
            raise
        limit = self.max_event_bytes
        if max(map(len, payloads)) > limit or any(m is not None and len(m.payload) > limit for m in metas):
            self._first_fault(pids, events, metas, offset)
        return WriteBatch(pids, types, slices, expected, counts, payloads, ser_ids, manifests, tags, metas)

    def _too_large(self, pid: str, payloads: Sequence[bytes], meta: Serialized | None) -> InvalidArgument | None:
        """The error of a call with an event (or metadata) above ``max_event_bytes``, or None."""
        sizes = [*map(len, payloads), *((len(meta.payload),) if meta is not None else ())]
        big = next(((i, n) for i, n in enumerate(sizes) if n > self.max_event_bytes), None)
        if big is None:
            return None
        what = f"event {big[0]}" if big[0] < len(payloads) else "the metadata"
        return InvalidArgument(
            f"{what} of {pid!r} is {big[1]:,} bytes serialized, above write.max_event_bytes "
            f"({self.max_event_bytes:,}): keep large payloads elsewhere and put a reference in the event"
        )

    def check(self, pid: Any, events: Any, expected: Any = None, tags: Any = (), metadata: Any = None) -> Checked:
        """One call checked, its metadata serialized (raises InvalidArgument or SerializationError)."""
        if type(events) is not list and type(events) is not tuple and not isinstance(events, list | tuple):
            raise InvalidArgument(f"events must be a list or tuple of events, got {type(events).__name__}")
        pid, entity_type, sl, n, clean_tags = _call(pid, len(events), expected, tags)
        meta = None if metadata is None else self.serializers.serialize(metadata, what="metadata")
        return pid, entity_type, sl, expected, n, clean_tags, meta

    def _first_fault(
        self, pids: Sequence[str], events: Sequence[Sequence[Any]], metas: Sequence[Serialized | None], offset: int
    ) -> None:
        """Part by part, in order: raises for the first part whose events do not serialize or
        are too large (the slow path of an error)."""
        for i, (pid, evs, meta) in enumerate(zip(pids, events, metas, strict=False), offset):
            try:
                _, _, payloads = self.serializers.serialize_events(evs, pid)
            except SerializationError as e:
                raise SerializationError(f"persist_many part {i}: {e}") from e
            too_large = self._too_large(pid, payloads, meta)
            if too_large is not None:
                raise InvalidArgument(f"persist_many part {i}: {too_large}")


def _call(pid: Any, n: int, expected: Any, tags: Any) -> tuple[str, str, int, int, tuple[str, ...]]:
    """The rules of every call: its pid, its number of events, its expected_seq_nr, its tags.
    Returns the pid, its entity type and slice, the count and the clean tags."""
    if type(pid) is not str or not 0 < len(pid) <= MAX_PERSISTENCE_ID_LENGTH or "\x00" in pid:
        validate_persistence_id(pid)
    if not 0 < n <= MAX_EVENTS_PER_CALL:
        raise InvalidArgument(
            f"persist({pid!r}) needs at least one event"
            if not n
            else f"at most {MAX_EVENTS_PER_CALL} events per call, got {n}"
        )
    if expected is not None and (type(expected) is not int or not 0 <= expected <= MAX_SEQ_NR - n):
        # the call's last event, expected + n, must still fit the bigint column
        validate_seq_nr("expected_seq_nr", expected, maximum=MAX_SEQ_NR - n)
    clean_tags = validate_tags(tags) if tags else ()
    cut = pid.find(ENTITY_TYPE_SEPARATOR)
    return pid, pid[:cut] if cut >= 0 else "", slice_for(pid), n, clean_tags


def replicated_batch(log_name: str, events: Sequence[ReplicatedEvent]) -> WriteBatch:
    """A batch of replicated events (serialized by their origin, in their source's log order) as
    one-event calls that append, checked by the rules of every call; a pid may come several
    times (each event after the one before). Raises ReplicationError for an event of another
    log, InvalidArgument for one no write may carry."""
    checked = []
    for e in events:
        pid, entity_type, sl, n, tags = _call(e.persistence_id, 1, None, e.tags)
        if entity_type != log_name:
            raise ReplicationError(f"event {pid!r} does not belong to log {log_name!r}")
        checked.append((pid, entity_type, sl, None, n, e.event.payload, e.event.ser_id, e.event.manifest, tags,
                        e.metadata))  # fmt: skip
    return WriteBatch(*zip(*checked, strict=True)) if checked else _EMPTY


_LIST_OR_TUPLE = frozenset({list, tuple})
_INT_OR_NONE = frozenset({int, type(None)})


def _plain_calls(parts: Sequence[object]) -> tuple[Sequence[str], Sequence[int | None], list[Any]] | None:
    """The pids, expected_seq_nrs and events of parts that are all the commonest call, a tuple
    ``(pid, [event])`` or ``(pid, [event], expected_seq_nr)``, or a ``Write`` without tags or
    metadata, whose every pid and expected_seq_nr passes the rules of :func:`_call` (checked a
    column at a time: ``zip``, ``map``, ``set``, loops in C); None for anything else, which is
    then checked part by part (and raises there, naming the part)."""
    columns = _plain_columns(parts)
    if columns is None:
        return None
    pids, events, expected = columns
    if not plain_pids(pids) or not _plain_expected(expected):
        return None
    if not set(map(type, events)) <= _LIST_OR_TUPLE or set(map(len, events)) != {1}:
        return None
    return pids, expected, [e for (e,) in events]


def _plain_columns(parts: Sequence[object]) -> tuple[Sequence[Any], Sequence[Any], Sequence[Any]] | None:
    """The pid, events and expected_seq_nr columns of tuples of one length without tags or
    metadata; None for anything else."""
    if not parts or not all(issubclass(t, tuple) for t in set(map(type, parts))):
        return None
    n, lengths = len(parts), set(map(len, cast("Sequence[tuple[Any, ...]]", parts)))
    if lengths == {2}:
        pids, events = zip(*parts, strict=True)  # type: ignore[call-overload]
        return pids, events, (None,) * n
    if lengths == {3}:
        pids, events, expected = zip(*parts, strict=True)  # type: ignore[call-overload]
        return pids, events, expected
    if lengths == {5}:
        pids, events, expected, tags, metadata = zip(*parts, strict=True)  # type: ignore[call-overload]
        if not any(tags) and metadata.count(None) == n:
            return pids, events, expected
    return None


def plain_pids(pids: Sequence[Any]) -> bool:
    """Does every pid pass the rules of :func:`_call` (a non-empty str, not too long, no NUL)?"""
    if set(map(type, pids)) != {str} or "\x00" in "".join(pids):
        return False
    sizes = set(map(len, pids))
    return min(sizes) > 0 and max(sizes) <= MAX_PERSISTENCE_ID_LENGTH


def _plain_expected(expected: Sequence[Any]) -> bool:
    """Is every expected_seq_nr None or an int the call's one event still fits above?"""
    kinds = set(map(type, expected))
    if not kinds <= _INT_OR_NONE:
        return False
    if int not in kinds:
        return True
    given = [e for e in expected if e is not None] if len(kinds) > 1 else expected
    return bool(min(given) >= 0 and max(given) <= MAX_SEQ_NR - 1)


def entity_types_of(pids: Sequence[str]) -> list[str]:
    """Each pid's entity type; in one pass of C when every pid has the first one's (the common
    bulk call: one entity type)."""
    first = pids[0]
    cut = first.find(ENTITY_TYPE_SEPARATOR)
    if cut >= 0:
        prefix = first[: cut + 1]  # holds one separator, its last character
        if sum(map(str.startswith, pids, repeat(prefix))) == len(pids):
            return [first[:cut]] * len(pids)
    return [p[: p.find(ENTITY_TYPE_SEPARATOR)] if ENTITY_TYPE_SEPARATOR in p else "" for p in pids]


def _first_repeat(pids: Sequence[str], seen: set[str]) -> int:
    """The index of the first of ``pids`` that ``seen`` or an earlier one of them holds."""
    mine = set(seen)
    for i, pid in enumerate(pids):
        if pid in mine:
            return i
        mine.add(pid)
    raise AssertionError("no pid repeats")


_EMPTY = WriteBatch((), (), (), (), (), (), (), (), (), ())
