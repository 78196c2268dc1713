"""Cassandra for the tests (a pytest plugin loaded by conftest.py): a real node, never a mock.

The cluster in ``CASSANDRA_CONTACT_POINTS`` (``host1,host2[:port]``) when set, else ONE local node
started for the session (:class:`journal.cassandra.local.LocalCassandra`: Cassandra 5.0 resolved
from Maven Central into the user's cache, free ports, a throwaway data directory). Without Java or
Maven the Cassandra tests are skipped with the reason, except in CI (``CI`` set), where they fail.
Each session gets its own keyspace; each test that asks for ``cassandra_keyspace`` gets its
tables truncated.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import pytest

CONTACT_POINTS = os.environ.get("CASSANDRA_CONTACT_POINTS")


def skip_or_fail(reason: str) -> NoReturn:
    """Skip with the reason on a developer's machine; fail in CI, where nothing may be skipped."""
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the Cassandra tests: {reason}", pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class CassandraTarget:
    """Where a Cassandra answers: contact points, CQL port and optional (username, password)."""

    hosts: tuple[str, ...]
    port: int
    credentials: tuple[str, str] | None = None

    @property
    def contact_points(self) -> str:
        return f"{','.join(self.hosts)}:{self.port}"

    def dsn(self, keyspace: str) -> str:
        return f"cassandra://{self.contact_points}/{keyspace}"

    def cluster(self) -> Any:
        from cassandra.auth import PlainTextAuthProvider
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import RoundRobinPolicy

        auth = PlainTextAuthProvider(*self.credentials) if self.credentials else None
        profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), request_timeout=60)
        return Cluster(list(self.hosts), port=self.port, auth_provider=auth, protocol_version=5,
                       execution_profiles={EXEC_PROFILE_DEFAULT: profile})  # fmt: skip


def recent_first_bucket(hours: int = 2) -> str:
    """A ``first_time_bucket`` a little before now: a tag query without offset reads every bucket
    from there, and Cassandra cannot list a tag's buckets (from 2015 that is ~95,000 reads)."""
    return (datetime.now(UTC) - timedelta(hours=hours)).strftime("%Y%m%dT%H:00")


def _start_local(authenticator: bool) -> Any:
    try:
        import cassandra  # noqa: F401
    except ImportError:
        skip_or_fail("the cassandra-driver package is missing: pip install -e '.[cassandra]'")
    from journal.cassandra.local import LocalCassandra
    from journal.errors import CassandraSetupError

    node = LocalCassandra(authenticator=authenticator)
    try:
        node.start()
    except CassandraSetupError as e:
        skip_or_fail(str(e))
    return node


@pytest.fixture(scope="session")
def cassandra_node() -> Iterator[CassandraTarget]:
    """The session's Cassandra: ``CASSANDRA_CONTACT_POINTS`` or one local node."""
    if CONTACT_POINTS:
        from journal.cassandra.connections import parse_target

        hosts, port, _ = parse_target(f"cassandra://{CONTACT_POINTS}/ks")
        yield CassandraTarget(tuple(hosts), port)
        return
    node = _start_local(authenticator=False)
    try:
        yield CassandraTarget((node.host,), node.port)
    finally:
        node.stop()


@pytest.fixture(scope="session")
def cassandra_auth_node() -> Iterator[CassandraTarget]:
    """A second local node with PasswordAuthenticator (started only for the tests that ask)."""
    node = _start_local(authenticator=True)
    try:
        yield CassandraTarget((node.host,), node.port, node.credentials)
    finally:
        node.stop()


@pytest.fixture(scope="session")
def cassandra_session(cassandra_node: CassandraTarget) -> Iterator[Any]:
    """A driver session for DDL and checks (synchronous: call it through ``asyncio.to_thread``)."""
    cluster = cassandra_node.cluster()
    try:
        yield cluster.connect()
    finally:
        cluster.shutdown()


def create_keyspace(session: Any, keyspace: str | None = None) -> str:
    """A fresh keyspace with the journal's tables (``schema.cql``); returns its name."""
    from journal.cassandra.cql import schema_statements

    ks = keyspace or f"sj_{uuid.uuid4().hex[:12]}"
    for stmt in schema_statements(ks):
        session.execute(stmt, timeout=60)
    return ks


def truncate_keyspace(session: Any, keyspace: str) -> None:
    rows = session.execute("SELECT table_name FROM system_schema.tables WHERE keyspace_name = %s", (keyspace,))
    for r in rows:
        session.execute(f"TRUNCATE {keyspace}.{r.table_name}", timeout=60)


@pytest.fixture(scope="session")
def _session_keyspace(cassandra_session: Any) -> Iterator[str]:
    ks = create_keyspace(cassandra_session)
    try:
        yield ks
    finally:
        cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)


@pytest.fixture
async def cassandra_keyspace(cassandra_session: Any, _session_keyspace: str) -> AsyncIterator[str]:
    """The session's keyspace with empty tables."""
    await asyncio.to_thread(truncate_keyspace, cassandra_session, _session_keyspace)
    yield _session_keyspace


@pytest.fixture
def cassandra_dsn(cassandra_node: CassandraTarget, cassandra_keyspace: str) -> str:
    """``cassandra://host:port/keyspace`` over empty tables."""
    return cassandra_node.dsn(cassandra_keyspace)


# -- one journal fixture over both backends --------------------------------------------------------

BACKENDS = [
    pytest.param("postgres", id="postgres"),
    pytest.param("cassandra", id="cassandra", marks=pytest.mark.cassandra),
]


@pytest.fixture(params=BACKENDS)
def journal_target(request: pytest.FixtureRequest) -> str:
    """The session's PostgreSQL database DSN, or a ``cassandra://`` DSN of a keyspace with empty
    tables (resolved here, outside the event loop; :func:`open_test_journal` opens it)."""
    if request.param == "cassandra":
        return str(request.getfixturevalue("cassandra_dsn"))
    return str(request.getfixturevalue("dsn"))


@pytest.fixture
def target_session(journal_target: str, request: pytest.FixtureRequest) -> Any:
    """The Cassandra driver session when ``journal_target`` is Cassandra, else None."""
    return request.getfixturevalue("cassandra_session") if journal_target.startswith("cassandra://") else None


def settings_for(target: str, **overrides: Any) -> Any:
    """Settings for a test journal on ``target``: a recent ``first_time_bucket`` on Cassandra."""
    from journal import JournalSettings

    if target.startswith("cassandra://"):
        overrides.setdefault("first_time_bucket", recent_first_bucket())
        return JournalSettings.load(env={}, **overrides)
    return JournalSettings.load(env={}, dsn=target, **overrides)


@asynccontextmanager
async def open_test_journal(target: str, clean: bool = True, **overrides: Any) -> AsyncIterator[Any]:
    """A journal on ``target`` (PostgreSQL tables truncated first unless ``clean`` is False)."""
    from conftest import truncate_all

    from journal import open_journal

    if clean and not target.startswith("cassandra://"):
        await truncate_all(target)
    async with open_journal(target, settings=settings_for(target, **overrides)) as j:
        yield j
