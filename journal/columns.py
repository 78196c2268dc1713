"""Many one-event writes as parallel columns: the bulk write path with no object per call.

A ``persist_many`` of thousands of parts would otherwise build a request, a serialized event
and a result tuple per part, and keep them alive across the database round trip: on CPython
that is as much work again as the statement itself, half of it in the cyclic garbage
collector's full passes over the survivors. Columns hold the same facts in a handful of lists of
strings, ints and bytes, which the collector does not track and the driver encodes directly.

Only the commonest shape travels as columns: every call writes one event, names its
``expected_seq_nr`` and has no tags or metadata. Anything else is written as
:class:`~journal.backend.WriteRequest` values, and so is a chunk whose optimistic insert fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from .backend import WriteRequest
from .serialization import Serialized


@dataclass(slots=True)
class WriteColumns:
    """One event per call; index ``i`` of every list belongs to call ``i``."""

    persistence_ids: list[str]
    entity_types: list[str]
    slices: list[int]
    expected_seq_nrs: list[int]
    """Each call's expected_seq_nr (its event gets the next number)."""
    payloads: list[bytes]
    ser_ids: list[int]

    def __len__(self) -> int:
        return len(self.persistence_ids)

    def chunk(self, start: int, end: int) -> WriteColumns:
        """Calls ``[start, end)`` (list slices: no per-call work in Python)."""
        return WriteColumns(
            self.persistence_ids[start:end], self.entity_types[start:end], self.slices[start:end],
            self.expected_seq_nrs[start:end], self.payloads[start:end], self.ser_ids[start:end],
        )  # fmt: skip

    def requests(self) -> list[WriteRequest]:
        """The same calls as requests (for the paths that isolate or resolve calls one by one)."""
        return [
            WriteRequest(pid, et, sl, expected, [Serialized(ser_id, "", payload)])
            for pid, et, sl, expected, payload, ser_id in zip(*self._lists(), strict=True)
        ]

    def _lists(self) -> tuple[list[str], list[str], list[int], list[int], list[bytes], list[int]]:
        return (self.persistence_ids, self.entity_types, self.slices, self.expected_seq_nrs, self.payloads,
                self.ser_ids)  # fmt: skip
