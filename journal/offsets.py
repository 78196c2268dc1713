"""Offsets: where a query resumes.

``TimestampOffset`` is the slice queries' offset: a database timestamp plus the sequence numbers
already seen *at exactly that timestamp*, so events sharing a timestamp are neither repeated nor
skipped on resume. ``SequenceOffset`` is a plain per-pid sequence number offset. ``NoOffset`` means
"from the beginning".
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from .errors import OffsetError


@dataclass(frozen=True, slots=True)
class NoOffset:
    """Start from the beginning."""


NO_OFFSET = NoOffset()


@dataclass(frozen=True, slots=True)
class SequenceOffset:
    """A sequence number offset (events by persistence id)."""

    value: int


@dataclass(frozen=True, slots=True)
class TimestampOffset:
    """A db_timestamp and the ``{pid: seq_nr}`` already seen at exactly that timestamp.

    ``read_timestamp`` is when the event was read (for lag metrics), not part of identity.
    """

    timestamp: datetime
    seen: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    read_timestamp: datetime | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.timestamp, datetime) or self.timestamp.tzinfo is None:
            raise OffsetError("TimestampOffset.timestamp must be a timezone-aware datetime")
        object.__setattr__(self, "timestamp", self.timestamp.astimezone(UTC))
        object.__setattr__(self, "seen", MappingProxyType(dict(self.seen)))

    @classmethod
    def trusted(cls, timestamp: datetime, seen: Mapping[str, int]) -> TimestampOffset:
        """Hot-path constructor for values already valid: a UTC datetime and a ``seen`` mapping
        the caller never mutates afterwards (used by the slice queries, once per event)."""
        o = object.__new__(cls)
        _SET_TIMESTAMP(o, timestamp)
        _SET_SEEN(o, MappingProxyType(seen))
        _SET_READ_TIMESTAMP(o, None)
        return o

    def is_after(self, timestamp: datetime, persistence_id: str, seq_nr: int) -> bool:
        """True if an event at (timestamp, pid, seq_nr) lies after this offset (not yet delivered)."""
        if timestamp > self.timestamp:
            return True
        if timestamp < self.timestamp:
            return False
        seen = self.seen.get(persistence_id)
        return seen is None or seq_nr > seen

    def to_json(self) -> dict[str, object]:
        return {"timestamp": self.timestamp.isoformat(), "seen": dict(self.seen)}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> TimestampOffset:
        ts = data.get("timestamp")
        seen = data.get("seen", {})
        if not isinstance(ts, str) or not isinstance(seen, dict):
            raise OffsetError(f"not a TimestampOffset: {data!r}")
        return cls(datetime.fromisoformat(ts), {str(k): int(v) for k, v in seen.items()})


@dataclass(frozen=True, slots=True)
class TimeUUIDOffset:
    """Events-by-tag offset: the time-based (v1) UUID of the last delivered event (exclusive)."""

    value: uuid.UUID

    def __post_init__(self) -> None:
        v = self.value
        if isinstance(v, str):
            try:
                v = uuid.UUID(v)
            except ValueError:
                raise OffsetError(f"not a UUID: {self.value!r}") from None
            object.__setattr__(self, "value", v)
        if not isinstance(v, uuid.UUID) or v.version != 1:
            raise OffsetError(f"TimeUUIDOffset needs a time-based (version 1) UUID, got {self.value!r}")

    def to_json(self) -> dict[str, object]:
        return {"timeuuid": str(self.value)}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> TimeUUIDOffset:
        v = data.get("timeuuid")
        if not isinstance(v, str):
            raise OffsetError(f"not a TimeUUIDOffset: {data!r}")
        return cls(uuid.UUID(v))


# Slot setters of the frozen dataclass, for TimestampOffset.trusted (bypasses the frozen check).
_SLOTS: dict[str, Any] = dict(vars(TimestampOffset))
_SET_TIMESTAMP = _SLOTS["timestamp"].__set__
_SET_SEEN = _SLOTS["seen"].__set__
_SET_READ_TIMESTAMP = _SLOTS["read_timestamp"].__set__

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Offset = NoOffset | SequenceOffset | TimestampOffset | TimeUUIDOffset
