"""The backend seam: both backends implement every Protocol of journal.backend in full, are
chosen by one factory, and answer the same way where they share a capability (never mocked:
PostgreSQL and Cassandra as the session runs them)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from cassandra_fixtures import open_test_journal

from journal import ConfigurationError, Journal, JournalUnavailable, SequenceConflict, UnsupportedOperation
from journal.backend import (
    Backend,
    CleanupStore,
    EventReads,
    EventWrites,
    Found,
    ManifestCount,
    Notifications,
    ReplicationStore,
    SliceQueryBackend,
    SliceReads,
    Snapshots,
    TagStore,
)
from journal.backends import backend_kind
from journal.cassandra.backend import CassandraBackend
from journal.cassandra.cleanup import CassandraCleanup
from journal.cassandra.tag_store import CassandraTagStore
from journal.postgres.backend import PostgresBackend
from journal.postgres.cleanup import PostgresCleanup
from journal.postgres.replication_store import PostgresReplicationStore
from journal.postgres.slice_reader import PostgresSliceReader
from journal.postgres.tag_store import PostgresTagStore
from journal.write_batch import WriteBatch


def members(protocol: type) -> set[str]:
    """Every attribute and method a Protocol declares, its bases' included."""
    out: set[str] = set()
    for cls in protocol.__mro__:
        if cls in (object,) or cls.__module__ == "typing":
            continue
        out |= {n for n in vars(cls) if not n.startswith("_")}
        out |= set(getattr(cls, "__annotations__", {}))
    return out


IMPLEMENTATIONS = [
    (Backend, PostgresBackend),
    (Backend, CassandraBackend),
    (SliceQueryBackend, PostgresSliceReader),
    (TagStore, PostgresTagStore),
    (TagStore, CassandraTagStore),
    (CleanupStore, PostgresCleanup),
    (CleanupStore, CassandraCleanup),
    (ReplicationStore, PostgresReplicationStore),
]


@pytest.mark.parametrize(("protocol", "impl"), IMPLEMENTATIONS, ids=lambda x: x.__name__)
def test_every_member_of_the_seam_is_implemented(protocol: type, impl: type) -> None:
    declared = members(protocol)
    assert declared, protocol
    attributes = set(getattr(protocol, "__annotations__", {}))
    for base in protocol.__mro__:
        attributes |= set(getattr(base, "__annotations__", {}))
    # attributes are set per instance; everything else must be a method of the class
    missing = {n for n in declared - attributes if not callable(getattr(impl, n, None))}
    assert not missing, f"{impl.__name__} lacks {sorted(missing)} of {protocol.__name__}"
    for name in declared - attributes:
        want, got = getattr(protocol, name), getattr(impl, name)
        assert inspect.iscoroutinefunction(want) == inspect.iscoroutinefunction(got), f"{impl.__name__}.{name}"


def test_the_backend_interface_is_the_sum_of_its_parts() -> None:
    assert members(EventWrites) | members(EventReads) | members(Snapshots) <= members(Backend)
    assert members(SliceReads) | members(EventReads) | members(Notifications) <= members(SliceQueryBackend)
    assert {"write_on", "check_write", "info", "slice_queries", "tag_store", "cleanup_store"} <= members(Backend)


@pytest.mark.parametrize(
    ("dsn", "kind"),
    [
        (None, "embedded"),
        ("postgresql://u@h/db", "postgres"),
        ("postgres://u@h/db", "postgres"),
        ("postgresql+psycopg://u@h/db", "postgres"),
        ("cassandra://h1,h2:9042/ks", "cassandra"),
    ],
)
def test_the_factory_chooses_by_scheme(dsn: str | None, kind: str) -> None:
    assert backend_kind(dsn) == kind


@pytest.mark.parametrize("dsn", ["mysql://x/y", "", "h1:5432/db", "sqlite:///x"])
def test_an_unknown_scheme_is_a_configuration_error(dsn: str) -> None:
    with pytest.raises(ConfigurationError):
        backend_kind(dsn)


async def test_each_backend_is_the_whole_seam(journal_target: str) -> None:
    async with open_test_journal(journal_target) as j:
        b: Any = j.backend
        assert isinstance(b, Backend)
        assert isinstance(b.tag_store(), TagStore)
        assert isinstance(b.cleanup_store(), CleanupStore)
        await j.persist("Seam|a", ["x", "y"])
        await j.persist("Other|b", ["z"])
        info = await b.info()
        assert info["events"]["Seam"] == 2 and info["events"]["Other"] == 1
        assert [m for m in await b.manifests() if m.kind == "event"] == [ManifestCount("event", 1, "", 3)]
        assert j._group_commit._max_in_flight == j.settings.write.max_in_flight  # on both backends
        if b.name == "postgres":
            assert isinstance(b.slice_queries(), SliceQueryBackend)
            assert isinstance(b.replication_store("here"), PostgresReplicationStore)
        else:
            with pytest.raises(UnsupportedOperation):
                b.slice_queries()
            with pytest.raises(UnsupportedOperation):
                b.replication_store("here")
            with pytest.raises(UnsupportedOperation, match="persist_in"):
                await j.persist_in(object(), "Seam|a", ["w"])


def request(j: Journal, pid: str, events: list[Any], expected: int) -> WriteBatch:
    return j._validator.call(pid, events, expected)


async def test_check_write_classifies_the_rows_of_a_write(journal_target: str) -> None:
    """What an interrupted write's resolution relies on, the same on both backends."""
    async with open_test_journal(journal_target) as j:
        envs = await j.persist("Seam|c", ["a", "b"], expected_seq_nr=0)
        (written,) = await j.backend.check_write(request(j, "Seam|c", ["a", "b"], 0))
        assert written.outcome is Found.WRITTEN
        assert written.db_timestamp is not None
        assert abs((written.db_timestamp - envs[0].db_timestamp).total_seconds()) < 0.001
        (other,) = await j.backend.check_write(request(j, "Seam|c", ["a", "changed"], 0))
        assert other.outcome is Found.CONFLICT
        async with open_test_journal(journal_target, clean=False) as other_writer:
            await other_writer.persist("Seam|d", ["a"], expected_seq_nr=0)
        (theirs,) = await j.backend.check_write(request(j, "Seam|d", ["a"], 0))
        assert theirs.outcome is Found.CONFLICT  # the same payload, another writer's row
        (nothing,) = await j.backend.check_write(request(j, "Seam|c", ["c"], 2))
        assert nothing.outcome is Found.NOT_WRITTEN and nothing.db_timestamp is None


async def test_resolve_persist_answers_for_an_interrupted_persist(journal_target: str) -> None:
    """The one resolution entities use (journal/entities/cell.py), over check_write."""
    async with open_test_journal(journal_target) as j:
        envs = await j.persist("Seam|r", [{"n": 1}, {"n": 2}], expected_seq_nr=0, metadata={"m": 1})
        again = await j.resolve_persist("Seam|r", [{"n": 1}, {"n": 2}], expected_seq_nr=0, metadata={"m": 1})
        assert [(e.seq_nr, e.event, e.writer, e.metadata) for e in again] == [
            (e.seq_nr, e.event, e.writer, e.metadata) for e in envs
        ]
        with pytest.raises(JournalUnavailable) as not_stored:
            await j.resolve_persist("Seam|r", [{"n": 3}], expected_seq_nr=2)
        assert not not_stored.value.outcome_unknown
        with pytest.raises(SequenceConflict):
            await j.resolve_persist("Seam|r", [{"n": 1}, {"n": 99}], expected_seq_nr=0)
        with pytest.raises(SequenceConflict):  # nothing at 6.., but the pid is not at 5
            await j.resolve_persist("Seam|r", [{"n": 6}], expected_seq_nr=5)
