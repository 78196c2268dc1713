"""The public API is small and explicit: ``journal.__all__`` and ``projections.__all__`` list what a
user needs and nothing internal, and every error the library raises is in the one tree, exported."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import journal
import journal.errors
import projections

JOURNAL_API = {
    # the facade, its events and offsets
    "Journal", "open_journal", "JournalSettings", "QueryMode", "EventEnvelope", "Snapshot",
    "Offset", "NoOffset", "NO_OFFSET", "SequenceOffset", "TimestampOffset", "TimeUUIDOffset",
    # ids and slices
    "NUMBER_OF_SLICES", "slice_for", "slice_ranges", "entity_type_of", "persistence_id_of",
    # bulk writes
    "Write", "Written", "Outcome", "failures",
    # durable state (issue 34)
    "DurableState", "State", "StateWrite", "StateWritten", "StateOutcome", "RevisionConflict",
    "UpdatedState", "DeletedState", "StateChange", "AdditionalColumn", "SKIP",
    # serialization
    "Serializer", "SerializerRegistry", "Serialized",
    # the backend seam (for a backend of one's own)
    "Backend",
    # entities
    "Entity", "EntityRegistry", "after_persist", "destinations_of", "routed_to",
    # collaboration: routing that delivers, views, conditional requests (vector time)
    "EventRouter", "routed_from", "View", "TimedReply", "VectorTime", "ConditionTimeout", "DeliveryScan",
    # the error tree
    "JournalError", "ConfigurationError", "SparkSetupError", "CassandraSetupError", "CassandraStartError",
    "InvalidArgument", "OffsetError", "SerializationError", "SequenceConflict", "JournalUnavailable",
    "TagWriteTimeout", "CircuitBreakerOpen", "StorageError", "UnsupportedOperation", "EventsMissing",
    "TagEventsMissing", "ProjectionError", "LeaseLost", "HandlerFailed", "ProjectionBusy", "EntityError",
    "PersistNotAllowed", "EntityStopped", "StashTimeout", "RecoveryFailed", "ReplicationError", "LocationMismatch",
    "IncompatibleVersion", "LocalWritesRefused", "SliceRangeMoved",
    "EventSeq", "StoredManifest", "Upcasters", "Forgotten", "KeyStore", "SubjectForgotten", "UnknownVersion",
    "KafkaSetupError", "KafkaStartError", "KafkaPublishError", "UnknownProjection", "NotProjected",
    "DestinationUnavailable", "DestinationRefused", "VersionNotReady",
}  # fmt: skip

PROJECTIONS_API = {
    "Worker", "TagWorker", "StateWorker", "MODES", "Mode", "load_handler", "Stats", "ProjectionStatus", "RangeStatus",
    "ProjectionError", "LeaseLost", "HandlerFailed", "ProjectionBusy", "HandlerRecovery", "DeadLetter",
    "WriteWaits", "wait_processed", "ProjectionVersion", "switch_version", "drop_version", "list_versions",
}  # fmt: skip


def test_journal_exports_exactly_the_public_names() -> None:
    assert set(journal.__all__) == JOURNAL_API
    assert len(journal.__all__) == len(JOURNAL_API), "a name is listed twice"
    for name in journal.__all__:
        assert getattr(journal, name) is not None, name


def test_projections_exports_exactly_the_public_names() -> None:
    assert set(projections.__all__) == PROJECTIONS_API
    for name in projections.__all__:
        assert getattr(projections, name) is not None, name
    for name in ("ProjectionError", "LeaseLost", "HandlerFailed", "ProjectionBusy"):
        assert getattr(projections, name) is getattr(journal.errors, name), "one tree: the same classes"


def _error_classes() -> dict[str, type]:
    return {
        name: value
        for name, value in vars(journal.errors).items()
        if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == journal.errors.__name__
    }


def test_every_error_is_in_the_tree_and_exported() -> None:
    classes = _error_classes()
    assert "ProjectionBusy" in classes and "TagWriteTimeout" in classes
    for name, cls in classes.items():
        assert issubclass(cls, journal.errors.JournalError), f"{name} is outside the tree"
        assert name in journal.errors.__all__, f"{name} is missing from journal.errors.__all__"
        assert name in journal.__all__, f"{name} is not exported by journal"
    assert set(journal.errors.__all__) == set(classes)
    assert issubclass(journal.errors.ProjectionBusy, journal.errors.ProjectionError)
    assert not issubclass(journal.errors.ProjectionBusy, journal.errors.ConfigurationError)


def test_no_exported_name_is_private_and_subpackage_exports_resolve() -> None:
    for package in (journal, projections):
        assert all(not n.startswith("_") for n in package.__all__)
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if not info.ispkg:
                continue
            module = importlib.import_module(info.name)
            for name in getattr(module, "__all__", ()):
                assert hasattr(module, name), f"{info.name}.__all__ names {name!r}, which it does not define"


def test_test_helpers_are_not_shipped() -> None:
    """Throwaway databases for tests live in tests/support, not in the installed packages."""
    shipped = {
        info.name
        for package in (journal, projections)
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
    }
    assert not {name for name in shipped if name.rsplit(".", 1)[-1] in ("scratch", "testing", "fixtures")}
