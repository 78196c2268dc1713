"""The bulk write API's value types: one :class:`Write` per persistence id in, one
:class:`Written` or typed error per part out (see :meth:`journal.Journal.persist_many`).

Results are small frozen structs rather than envelopes: a bulk caller writing thousands of parts
reads the sequence numbers and the timestamp, and building an envelope per event would cost about
as much as writing it. :class:`Written` is a ``msgspec.Struct`` (as the envelopes and the write
batches are), built from the result's columns by a loop in C: a ``NamedTuple`` runs its
``__new__`` in Python per part (about 0.2 ms per 1,000 parts, 5 % of a call's client CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import msgspec

from .errors import JournalError, StorageError
from .write_batch import BatchResult, WriteBatch


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


class Written(msgspec.Struct, frozen=True, gc=False):
    """A part that was written: its events got ``first_seq_nr..last_seq_nr`` and one timestamp.
    Read its fields by name (it is not a tuple)."""

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


def outcomes(batch: WriteBatch, result: BatchResult) -> list[Outcome]:
    """The caller's view of a bulk write's result: :class:`Written` per part, or its error."""
    firsts = result.first_seq_nrs
    lasts = firsts if batch.one_event_each() else [f + n - 1 for f, n in zip(firsts, batch.counts, strict=True)]
    out: list[Outcome] = list(map(Written, batch.persistence_ids, firsts, lasts, result.db_timestamps))
    for i, error in result.errors.items():  # the common case: none
        out[i] = _failed(batch.persistence_ids[i], error)
    return out


def _failed(pid: str, res: object) -> JournalError:
    if isinstance(res, JournalError):
        return res
    err = StorageError(f"write of {pid!r} failed: {type(res).__name__}: {res}")
    err.__cause__ = res if isinstance(res, BaseException) else None
    return err
