"""What every write crosses the backend seam as: a :class:`WriteBatch` of calls, as columns, and
the :class:`BatchResult` that comes back.

One shape for every kind of write (one ``persist``, a group-commit batch of many, a chunk of a
``persist_many``, ``persist_in``, the entity cell's writes): :mod:`journal.write_validation` is
the one place that builds it, from checked and serialized calls. Columns rather than an object
per call: a batch of a thousand calls is a handful of lists of strings, ints and bytes, which
the driver encodes directly and the garbage collector does not track.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from itertools import accumulate, chain

import msgspec
from msgspec.structs import astuple

from .serialization import Serialized


class WriteBatch(msgspec.Struct, frozen=True, gc=False):
    """Calls written together; each is atomic on its own and a batch names each pid once.

    Call ``i`` writes ``counts[i]`` events to ``persistence_ids[i]``, numbered after
    ``expected_seq_nrs[i]``: the highest sequence number its caller believes is stored, or None
    to append after whatever is stored. Its events are the next ``counts[i]`` entries of the
    per-event columns (``payloads``, ``ser_ids``, ``manifests``), in call order. ``tags`` and
    ``metadata`` are per call (every event of a call carries them).
    """

    persistence_ids: Sequence[str]
    entity_types: Sequence[str]
    slices: Sequence[int]
    expected_seq_nrs: Sequence[int | None]
    counts: Sequence[int]
    payloads: Sequence[bytes]
    ser_ids: Sequence[int]
    manifests: Sequence[str]
    tags: Sequence[tuple[str, ...]]
    metadata: Sequence[Serialized | None]

    def __len__(self) -> int:
        return len(self.persistence_ids)

    @property
    def events(self) -> int:
        return len(self.payloads)

    def one_event_each(self) -> bool:
        return len(self.payloads) == len(self.persistence_ids)

    def firsts(self) -> list[int]:
        """The index of each call's first event in the per-event columns."""
        if self.one_event_each():
            return list(range(len(self.persistence_ids)))
        return list(accumulate(self.counts[:-1], initial=0))

    def serialized(self) -> list[list[Serialized]]:
        """Each call's events (for the paths that handle calls one by one)."""
        events = list(map(Serialized, self.ser_ids, self.manifests, self.payloads))
        return [events[f : f + n] for f, n in zip(self.firsts(), self.counts, strict=True)]

    def select(self, calls: Sequence[int]) -> WriteBatch:
        """The batch of the calls at these indexes, in that order."""
        firsts = self.firsts()
        events = [e for i in calls for e in range(firsts[i], firsts[i] + self.counts[i])]
        return WriteBatch(
            [self.persistence_ids[i] for i in calls], [self.entity_types[i] for i in calls],
            [self.slices[i] for i in calls], [self.expected_seq_nrs[i] for i in calls],
            [self.counts[i] for i in calls], [self.payloads[e] for e in events], [self.ser_ids[e] for e in events],
            [self.manifests[e] for e in events], [self.tags[i] for i in calls], [self.metadata[i] for i in calls],
        )  # fmt: skip

    def chunk(self, start: int, end: int) -> WriteBatch:
        """Calls ``[start, end)`` (list slices: no per-call work in Python)."""
        if self.one_event_each():
            first, last = start, end
        else:
            first = sum(self.counts[:start])
            last = first + sum(self.counts[start:end])
        return WriteBatch(
            self.persistence_ids[start:end], self.entity_types[start:end], self.slices[start:end],
            self.expected_seq_nrs[start:end], self.counts[start:end], self.payloads[first:last],
            self.ser_ids[first:last], self.manifests[first:last], self.tags[start:end], self.metadata[start:end],
        )  # fmt: skip

    @staticmethod
    def concat(batches: Sequence[WriteBatch]) -> WriteBatch:
        """One batch of the calls of ``batches``, in order (the group commit's statement):
        transposed with ``zip``, a loop in C."""
        if len(batches) == 1:
            return batches[0]
        columns = list(zip(*map(astuple, batches), strict=True))
        if set(map(len, columns[_PIDS])) == set(map(len, columns[_PAYLOADS])) == {1}:  # one call of one event each
            return WriteBatch(*[[v for (v,) in c] for c in columns])
        return WriteBatch(*[list(chain.from_iterable(c)) for c in columns])


_PIDS = WriteBatch.__struct_fields__.index("persistence_ids")
_PAYLOADS = WriteBatch.__struct_fields__.index("payloads")


class BatchResult(msgspec.Struct, frozen=True):
    """What the calls of a :class:`WriteBatch` got, by index: call ``i`` was written from
    ``first_seq_nrs[i]`` on, its first event stamped ``db_timestamps[i]`` (its next events one
    :data:`~journal.envelope.ROW_STEP` apart), unless ``errors`` has ``i``: then nothing of it
    was written (except for ``JournalUnavailable(outcome_unknown=True)``, which says it may
    have been). The values at a failed call's index mean nothing."""

    first_seq_nrs: Sequence[int]
    db_timestamps: Sequence[datetime]
    errors: Mapping[int, Exception] = msgspec.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.first_seq_nrs)

    def part(self, start: int, end: int) -> BatchResult:
        """The results of calls ``[start, end)``."""
        errors = {i - start: e for i, e in self.errors.items() if start <= i < end}
        return BatchResult(self.first_seq_nrs[start:end], self.db_timestamps[start:end], errors)

    @staticmethod
    def concat(results: Sequence[BatchResult]) -> BatchResult:
        """The results of consecutive batches as one."""
        if len(results) == 1:
            return results[0]
        errors: dict[int, Exception] = {}
        offset = 0
        for r in results:
            errors.update({offset + i: e for i, e in r.errors.items()})
            offset += len(r)
        firsts = list(chain.from_iterable(r.first_seq_nrs for r in results))
        return BatchResult(firsts, list(chain.from_iterable(r.db_timestamps for r in results)), errors)

    @staticmethod
    def failed(calls: int, error: Exception) -> BatchResult:
        """Every call of a batch failed with ``error``."""
        return BatchResult([0] * calls, [_NEVER] * calls, dict.fromkeys(range(calls), error))


_NEVER = datetime.min


class ResultBuilder:
    """A batch's :class:`BatchResult` put together call by call, or from the results of
    sub-batches (the paths that isolate calls or write them one by one)."""

    def __init__(self, calls: int) -> None:
        self._firsts = [0] * calls
        self._stamps = [_NEVER] * calls
        self._errors: dict[int, Exception] = {}

    def written(self, call: int, first_seq_nr: int, db_timestamp: datetime) -> None:
        self._firsts[call] = first_seq_nr
        self._stamps[call] = db_timestamp

    def failed(self, call: int, error: Exception) -> None:
        self._errors[call] = error

    def merge(self, calls: Sequence[int], result: BatchResult) -> None:
        """The result of the sub-batch of ``calls`` (indexes into this batch, in its order)."""
        for j, i in enumerate(calls):
            error = result.errors.get(j)
            if error is None:
                self.written(i, result.first_seq_nrs[j], result.db_timestamps[j])
            else:
                self.failed(i, error)

    def result(self) -> BatchResult:
        return BatchResult(self._firsts, self._stamps, self._errors)


class WriteLater(Exception):
    """Not an outcome: calls whose outcome a backend must wait for: their slice range (a move
    fences or switches it; the partitioned journal), the resolution of their interrupted write
    (the partitioned journal), or their tag rows (Cassandra). The calls deferred together carry
    one instance (a result may hold several: each is finished on its own, and its calls answered
    as soon as it is). ``finish()`` does that wait and whatever write follows it, on its own
    (never inside a batch other callers wait on), and returns their result in the order of
    ``calls``; it never defers again."""

    def __init__(self, calls: Sequence[int], finish: Callable[[], Awaitable[BatchResult]]) -> None:
        super().__init__("the call's outcome is waited for apart from its batch")
        self.calls = list(calls)
        self.finish = finish


def deferred(result: BatchResult) -> WriteLater | None:
    """The result's first :class:`WriteLater`, if some of its calls wait (a backend's own result
    that defers its calls together has one)."""
    if result.errors:
        for e in result.errors.values():
            if type(e) is WriteLater:
                return e
    return None


def deferrals(result: BatchResult) -> list[WriteLater]:
    """Every :class:`WriteLater` of the result (none when no call waits)."""
    if not result.errors:
        return []
    found = {id(e): e for e in result.errors.values() if type(e) is WriteLater}
    return list(found.values())


def completed(result: BatchResult, later: WriteLater, got: BatchResult) -> BatchResult:
    """``result`` with its deferred calls' outcomes (``got``, of ``later.calls``) in place."""
    firsts, stamps = list(result.first_seq_nrs), list(result.db_timestamps)
    errors = {i: e for i, e in result.errors.items() if e is not later}
    for j, i in enumerate(later.calls):
        error = got.errors.get(j)
        if error is None:
            firsts[i], stamps[i] = got.first_seq_nrs[j], got.db_timestamps[j]
        else:
            errors[i] = error
    return BatchResult(firsts, stamps, errors)


WriteFn = Callable[[WriteBatch], Awaitable[BatchResult]]
"""What writes one batch (a backend's ``write_batch``, or a wrapper of it)."""
