"""What replication moves between locations (model layer, no I/O)."""

from __future__ import annotations

from dataclasses import dataclass

from .serialization import Serialized
from .vector_time import VectorTime


@dataclass(frozen=True, slots=True)
class ReplicatedEvent:
    """One event of a replicated log, as its source stores it.

    ``origin_location``/``origin_seq_nr`` identify the event everywhere (the origin's log
    position); ``log_seq_nr`` is its position in the log it is read from (differs per location).
    The payload stays serialized: replication never needs to understand it.
    """

    persistence_id: str
    event: Serialized
    origin_location: str
    origin_seq_nr: int
    vector_time: VectorTime
    log_seq_nr: int
    tags: tuple[str, ...] = ()
    metadata: Serialized | None = None

    @property
    def event_id(self) -> tuple[str, int]:
        return (self.origin_location, self.origin_seq_nr)


@dataclass(frozen=True, slots=True)
class ReplicationBatch:
    """A source's answer to a read: events after the asked position and the last position
    scanned, where the next read resumes. Events the target's version vector covers are sent as
    identities only (``covered``): the target most likely stored them, and asks for those it did
    not (a filter on another path may have kept them from it)."""

    source_location: str
    log_name: str
    events: tuple[ReplicatedEvent, ...]
    last_scanned: int
    covered: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What one replicated batch did at the target."""

    written: int
    dropped: int
    progress: int
