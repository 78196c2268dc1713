"""The Cassandra backend's connection: the driver's cluster and session, every statement
prepared once with its consistency level, the bridge from the driver's callbacks to asyncio, and
the mapping of driver errors into the library's tree (one place).

Every part of the backend (writes, reads, snapshots, info, the tag and cleanup stores) holds the
same :class:`CassandraConnections`; only the backend opens and closes it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from ..errors import ConfigurationError, JournalUnavailable, StorageError
from ..settings import JournalSettings
from .cql import statements, validate_keyspace
from .partitions import PartitionLayout
from .session import PAGE_PROFILE, build_cluster, consistency, is_read


def parse_target(target: str) -> tuple[list[str], int, str]:
    """``cassandra://host1,host2[:port]/keyspace`` -> (contact points, port, keyspace)."""
    parts = urlsplit(target)
    if parts.scheme != "cassandra" or not parts.netloc:
        raise ConfigurationError(f"expected cassandra://host1,host2/keyspace, got {target!r}")
    port = 9042
    hosts = []
    for h in parts.netloc.split(","):
        host, _, p = h.partition(":")
        if p:
            port = int(p)
        hosts.append(host)
    keyspace = validate_keyspace(parts.path.strip("/") or "akka")
    return hosts, port, keyspace


async def execute(
    session: Any, stmt: Any, params: Sequence[Any] | None = None, profile: str | None = None
) -> list[Any]:
    """execute_async -> asyncio, every page of the result.

    The driver calls ``add_callbacks``' callback on its own event thread with ONE page of rows
    (5000 by default); when ``has_more_pages`` is set, ``start_fetching_next_page()`` fetches the
    next one and the same callbacks run again. Results settle on our loop through
    ``call_soon_threadsafe`` (a loop closed meanwhile is ignored: nobody awaits any more).
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[list[Any]] = loop.create_future()
    rows: list[Any] = []
    rf = (
        session.execute_async(stmt, params)
        if profile is None
        else session.execute_async(stmt, params, execution_profile=profile)
    )

    def settle(exc: BaseException | None) -> None:
        if fut.done():  # cancelled by the awaiting side
            return
        if exc is not None:
            fut.set_exception(map_error(exc))
        else:
            fut.set_result(rows)

    def to_loop(exc: BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(settle, exc)
        except RuntimeError:  # the loop is closed
            pass

    def ok(page: Any) -> None:
        rows.extend(page or ())
        if rf.has_more_pages and not fut.done():
            rf.start_fetching_next_page()
        else:
            to_loop(None)

    def err(exc: BaseException) -> None:
        to_loop(exc)

    rf.add_callbacks(ok, err)
    return await fut


_SENT = {"WriteTimeout", "WriteFailure", "OperationTimedOut", "ConnectionShutdown", "ConnectionBusy"}
"""Driver errors after which a statement may have reached a replica: a write's outcome is unknown."""
_NOT_SENT = {"Unavailable", "ReadTimeout", "ReadFailure", "OverloadedErrorMessage", "IsBootstrappingErrorMessage"}
"""Coordinator refusals and read failures: nothing was written."""


def map_error(exc: BaseException) -> BaseException:
    """Driver errors into the library's tree (one place). ``outcome_unknown`` is set when the
    statement may have been applied: a timeout, or a connection lost while it was in flight
    (also when NoHostAvailable wraps one); a host that was down or refused the connection, or a
    coordinator that answered Unavailable, means it was not."""
    from cassandra import RequestValidationException
    from cassandra.cluster import NoHostAvailable
    from cassandra.connection import ConnectionException

    name = type(exc).__name__
    if isinstance(exc, NoHostAvailable):
        inner = list((exc.errors or {}).values())
        if inner and all(type(e).__name__ == "AuthenticationFailed" for e in inner):
            return ConfigurationError(f"cassandra: authentication failed: {exc}")
        sent = any(type(e).__name__ in _SENT for e in inner)
        return JournalUnavailable(f"cassandra: {name}: {exc}", outcome_unknown=sent)
    if name in _SENT:
        return JournalUnavailable(f"cassandra: {name}: {exc}", outcome_unknown=True)
    if name in _NOT_SENT or isinstance(exc, ConnectionException | OSError):
        return JournalUnavailable(f"cassandra: {name}: {exc}", outcome_unknown=False)
    if isinstance(exc, RequestValidationException):  # the server refused the statement: nothing applied
        return StorageError(f"cassandra: {name}: {exc}")
    return exc


def connect_error(where: str, exc: BaseException) -> BaseException:
    """A failed connect as the library's error (:func:`map_error`), its message naming the
    contact points, the keyspace and each host's cause in one line."""
    from cassandra.cluster import NoHostAvailable

    mapped = map_error(exc)
    if not isinstance(exc, NoHostAvailable) or not isinstance(mapped, ConfigurationError | JournalUnavailable):
        return mapped
    causes = "; ".join(
        f"{host}: {' '.join(str(e).split('Last error: ')[-1].split()) or type(e).__name__}"
        for host, e in (exc.errors or {}).items()
    )
    message = f"cannot connect to Cassandra at {where}: {causes or 'no host answered'}"
    if isinstance(mapped, ConfigurationError):  # every host refused the login
        return ConfigurationError(f"cannot connect to Cassandra at {where}: authentication failed: {causes}")
    return JournalUnavailable(message, outcome_unknown=mapped.outcome_unknown)


class CassandraConnections:
    """The session of one keyspace (not connected until :meth:`open`)."""

    def __init__(self, contact_points: list[str], port: int, keyspace: str, settings: JournalSettings) -> None:
        self.contact_points, self.port, self.keyspace = contact_points, port, keyspace
        self.settings = settings
        self.layout = PartitionLayout(settings.cassandra.target_partition_size)
        self.write_cl = consistency(settings.cassandra.write_consistency)
        self.cql = statements(keyspace)
        self.session: Any = None
        self._cluster: Any = None
        self.prepared: dict[str, Any] = {}

    async def open(self) -> None:
        s = self.settings.cassandra
        self._cluster = build_cluster(self.contact_points, self.port, s)
        read_cl = consistency(s.read_consistency)
        try:
            self.session = await asyncio.to_thread(self._cluster.connect)
            for name, text in self.cql.items():
                stmt = await asyncio.to_thread(self.session.prepare, text)
                stmt.consistency_level = read_cl if is_read(text) else self.write_cl
                self.prepared[name] = stmt
            self._check_datacenter(s.local_datacenter)
        except Exception as e:
            error = self._open_error(e)
            await self.close()
            raise error from e

    def _open_error(self, e: Exception) -> BaseException:
        """Why opening failed, in the library's terms."""
        if isinstance(e, ConfigurationError):
            return e
        try:  # a local datacenter with no node: the driver connects to nothing at all
            self._check_datacenter(self.settings.cassandra.local_datacenter)
        except ConfigurationError as bad:
            return bad
        if "highest_sequence_nr" in str(e):
            return ConfigurationError(
                f"{self.keyspace}.messages lacks the single-writer check's static column: run "
                f"ALTER TABLE {self.keyspace}.messages ADD highest_sequence_nr bigint static"
            )
        if type(e).__name__ == "InvalidRequest":  # "keyspace x does not exist", "unconfigured table"
            return ConfigurationError(
                f"keyspace {self.keyspace!r} or its tables are missing ({e}): create them (development: "
                f"journal cassandra-schema --create --dsn {self.target})"
            )
        return connect_error(self.target, e)

    @property
    def target(self) -> str:
        """``cassandra://host1,host2:port/keyspace``, as messages name this cluster."""
        return f"cassandra://{','.join(self.contact_points)}:{self.port}/{self.keyspace}"

    def _check_datacenter(self, dc: str | None) -> None:
        """A local datacenter that no node belongs to would route nothing: refused at open."""
        known = {h.datacenter for h in self._cluster.metadata.all_hosts()}
        if dc is not None and dc not in known:
            raise ConfigurationError(f"cassandra local_datacenter {dc!r} is not one of the cluster's: {sorted(known)}")

    def release_versions(self) -> list[str]:
        """The Cassandra releases of the cluster's nodes, as the driver saw them."""
        return sorted({str(h.release_version) for h in self._cluster.metadata.all_hosts() if h.release_version})

    async def close(self) -> None:
        if self._cluster is not None:
            await asyncio.to_thread(self._cluster.shutdown)
            self._cluster = None

    async def run(self, name: str, *params: Any) -> list[Any]:
        """A prepared statement by name, every page of its result."""
        return await execute(self.session, self.prepared[name], params)

    async def run_for_dicts(self, name: str, *params: Any) -> list[dict[str, Any]]:
        """:meth:`run`, each row a dict by column name (:data:`~.session.PAGE_PROFILE`)."""
        return await execute(self.session, self.prepared[name], params, PAGE_PROFILE)


class CassandraPart:
    """A concern of the Cassandra backend over the shared connection. The backend inherits the
    parts that make up its interface (writes, reads, snapshots, info) and composes the stores."""

    def __init__(self, conns: CassandraConnections) -> None:
        self.conns = conns
        self.settings = conns.settings
        self.layout = conns.layout
        self.keyspace = conns.keyspace

    async def run(self, name: str, *params: Any) -> list[Any]:
        return await self.conns.run(name, *params)
