"""slice-journal: an event journal for Python services on PostgreSQL, built on the slice design.

The public API is what ``__all__`` lists; everything else is internal.
"""

from .backend import Backend
from .envelope import EventEnvelope
from .errors import (
    ConfigurationError,
    EventsMissing,
    InvalidArgument,
    JournalError,
    JournalUnavailable,
    OffsetError,
    SequenceConflict,
    SerializationError,
    SparkSetupError,
    UnsupportedOperation,
)
from .ids import NUMBER_OF_SLICES, entity_type_of, persistence_id_of, slice_for, slice_ranges
from .journal import Journal, open_journal
from .offsets import NO_OFFSET, NoOffset, Sequence, TimestampOffset
from .serialization import Serialized, Serializer, SerializerRegistry
from .settings import JournalSettings
from .snapshots import Snapshot

__all__ = [
    "NO_OFFSET",
    "NUMBER_OF_SLICES",
    "Backend",
    "ConfigurationError",
    "EventEnvelope",
    "EventsMissing",
    "InvalidArgument",
    "Journal",
    "JournalError",
    "JournalSettings",
    "JournalUnavailable",
    "NoOffset",
    "OffsetError",
    "Sequence",
    "SequenceConflict",
    "SerializationError",
    "Serialized",
    "Serializer",
    "SerializerRegistry",
    "Snapshot",
    "SparkSetupError",
    "TimestampOffset",
    "UnsupportedOperation",
    "entity_type_of",
    "open_journal",
    "persistence_id_of",
    "slice_for",
    "slice_ranges",
]
