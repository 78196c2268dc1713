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

from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

from .errors import InvalidArgument, SerializationError
from .ids import (
    ENTITY_TYPE_SEPARATOR,
    MAX_PERSISTENCE_ID_LENGTH,
    MAX_SEQ_NR,
    slice_for,
    validate_persistence_id,
    validate_seq_nr,
    validate_tags,
)
from .serialization import Serialized, SerializerRegistry
from .write_batch import WriteBatch

MAX_EVENTS_PER_CALL = 10_000
"""At most this many events in one ``persist`` call or one ``persist_many`` part."""

Part = tuple[str, str, int, "int | None", int, list[int], list[str], list[bytes], tuple[str, ...], "Serialized | None"]
"""One checked call: pid, entity type, slice, expected_seq_nr, event count, and its events' serializer
ids, manifests and payloads, its tags and its serialized metadata (the columns of a batch)."""


class WriteValidator:
    """Checks and serializes calls with one serializer registry (see the module docstring)."""

    def __init__(self, serializers: SerializerRegistry) -> None:
        self.serializers = serializers

    def call(self, pid: Any, events: Any, expected: Any = None, tags: Any = (), metadata: Any = None) -> WriteBatch:
        """One ``persist`` call as a batch of one."""
        p = self.part(pid, events, expected, tags, metadata)
        return WriteBatch((p[0],), (p[1],), (p[2],), (p[3],), (p[4],), p[7], p[5], p[6], (p[8],), (p[9],))

    def batch(self, parts: Iterable[object]) -> WriteBatch:
        """The parts of a ``persist_many`` call (``Write`` values or plain tuples of its fields) as
        one batch. Raises InvalidArgument or SerializationError naming the part's index, also
        for a pid in two parts."""
        checked: list[Part] = []
        append = checked.append
        part = self.part
        for i, w in enumerate(parts):
            try:
                if (type(w) is not tuple and not isinstance(w, tuple)) or not 2 <= len(w) <= 5:
                    raise InvalidArgument(
                        f"expected a Write or a (pid, events[, expected_seq_nr, tags, metadata]) tuple, got {w!r:.80}"
                    )
                append(part(*w))
            except (InvalidArgument, SerializationError) as e:
                raise type(e)(f"persist_many part {i}: {e}") from e
        return _columns(checked)

    def part(self, pid: Any, events: Any, expected: Any = None, tags: Any = (), metadata: Any = None) -> Part:
        """One call checked and serialized (raises InvalidArgument or SerializationError)."""
        if type(pid) is not str or not 0 < len(pid) <= MAX_PERSISTENCE_ID_LENGTH or "\x00" in pid:
            validate_persistence_id(pid)
        if type(events) is not list and type(events) is not tuple and not isinstance(events, list | tuple):
            raise InvalidArgument(f"events must be a list or tuple of events, got {type(events).__name__}")
        n = len(events)
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
        ser_ids, manifests, payloads = self.serializers.serialize_events(events, pid)
        meta = None if metadata is None else self.serializers.serialize(metadata, what="metadata")
        cut = pid.find(ENTITY_TYPE_SEPARATOR)
        entity_type = pid[:cut] if cut >= 0 else ""
        return pid, entity_type, slice_for(pid), expected, n, ser_ids, manifests, payloads, clean_tags, meta


def _columns(parts: Sequence[Part]) -> WriteBatch:
    """Checked parts as one batch (transposed with ``zip``: loops in C); refuses a repeated pid."""
    if not parts:
        return WriteBatch((), (), (), (), (), (), (), (), (), ())
    pids, types, slices, expected, counts, ser_ids, manifests, payloads, tags, metas = zip(*parts, strict=True)
    if len(set(pids)) != len(pids):
        _refuse_repeats(pids)
    return WriteBatch(
        pids, types, slices, expected, counts, _flat(payloads), _flat(ser_ids), _flat(manifests), tags, metas
    )


def _flat(columns: Sequence[list[Any]]) -> list[Any]:
    return list(chain.from_iterable(columns))


def _refuse_repeats(pids: Sequence[str]) -> None:
    seen: set[str] = set()
    for i, pid in enumerate(pids):
        if pid in seen:
            raise InvalidArgument(f"persist_many part {i}: {pid!r} appears in an earlier part; one part per pid")
        seen.add(pid)
