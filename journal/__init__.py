"""slice-journal: an event journal for Python services on PostgreSQL, built on the slice design.

The public API is what ``__all__`` lists; everything else is internal.
"""

from .backend import Backend
from .bulk import Outcome, Write, Written, failures
from .entities import (
    Entity,
    EntityRegistry,
    EventRouter,
    TimedReply,
    View,
    after_persist,
    destinations_of,
    routed_from,
    routed_to,
)
from .envelope import EventEnvelope
from .errors import (
    CircuitBreakerOpen,
    ConditionTimeout,
    ConfigurationError,
    EntityError,
    EntityStopped,
    EventsMissing,
    InvalidArgument,
    JournalError,
    JournalUnavailable,
    OffsetError,
    PersistNotAllowed,
    RecoveryFailed,
    SequenceConflict,
    SerializationError,
    SparkSetupError,
    StorageError,
    TagEventsMissing,
    TagWriteTimeout,
    UnsupportedOperation,
)
from .ids import NUMBER_OF_SLICES, entity_type_of, persistence_id_of, slice_for, slice_ranges
from .journal import Journal, open_journal
from .offsets import NO_OFFSET, NoOffset, SequenceOffset, TimestampOffset, TimeUUIDOffset
from .replication.vector_time import VectorTime
from .serialization import Serialized, Serializer, SerializerRegistry
from .settings import JournalSettings
from .snapshots import Snapshot

__all__ = [
    "NO_OFFSET",
    "NUMBER_OF_SLICES",
    "Backend",
    "CircuitBreakerOpen",
    "ConditionTimeout",
    "ConfigurationError",
    "Entity",
    "EntityError",
    "EntityRegistry",
    "EntityStopped",
    "EventEnvelope",
    "EventRouter",
    "EventsMissing",
    "InvalidArgument",
    "Journal",
    "JournalError",
    "JournalSettings",
    "JournalUnavailable",
    "NoOffset",
    "OffsetError",
    "Outcome",
    "PersistNotAllowed",
    "RecoveryFailed",
    "SequenceConflict",
    "SequenceOffset",
    "SerializationError",
    "Serialized",
    "Serializer",
    "SerializerRegistry",
    "Snapshot",
    "SparkSetupError",
    "StorageError",
    "TagEventsMissing",
    "TagWriteTimeout",
    "TimeUUIDOffset",
    "TimedReply",
    "TimestampOffset",
    "UnsupportedOperation",
    "VectorTime",
    "View",
    "Write",
    "Written",
    "after_persist",
    "destinations_of",
    "entity_type_of",
    "failures",
    "open_journal",
    "persistence_id_of",
    "routed_from",
    "routed_to",
    "slice_for",
    "slice_ranges",
]
