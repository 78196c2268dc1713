"""The Postgres backend's connections: one pool for reads and small statements, the group
commit's own write connections, and the one retry helper every part runs its statements with.

Every part of the backend (writes, reads, slice reads, snapshots, info, the tag, cleanup and
replication stores) holds the same :class:`PostgresConnections`; only the backend opens and
closes it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from ..errors import ConfigurationError, JournalUnavailable
from ..settings import JournalSettings
from ..transaction_slots import TransactionSlots
from .dsn import asyncpg_dsn, target_of
from .errors import with_retries
from .statements import Statements
from .writer_connections import WriterConnections

T = TypeVar("T")


class PostgresConnections:
    """The pool and the write connections of one journal database (not open until :meth:`open`)."""

    def __init__(self, dsn: str, settings: JournalSettings, writer_id: str) -> None:
        self.dsn = asyncpg_dsn(dsn)
        self.target = target_of(self.dsn)
        """``host:port/database``, as messages name this server."""
        self.settings = settings
        self.writer_id = writer_id
        self.sql = Statements(settings.schema)
        self.application_name = f"slice-journal pool {writer_id}"[:63]
        """Of every pooled connection: the workers and tools this pool is lent to
        (:meth:`~.backend.PostgresBackend.shared_connections`) find their server processes by it."""
        self.transactions = TransactionSlots.of_shared_pool(settings.connection.pool_max_size)
        """The projection transactions on this pool (:mod:`journal.transaction_slots`)."""
        self.epoch = 0
        """The partition map epoch this journal's writes and slice reads send (the database
        refuses a range whose last change is newer: :mod:`.timestamp_rule`)."""
        self._pool: asyncpg.Pool | None = None
        self._writers: WriterConnections | None = None

    async def open(self) -> None:
        """Connect (with retries) and check the schema was migrated."""
        c = self.settings.connection

        async def connect() -> asyncpg.Pool:
            return await asyncpg.create_pool(
                self.dsn,
                min_size=c.pool_min_size,
                max_size=c.pool_max_size,
                timeout=c.connect_timeout,
                command_timeout=None,
                server_settings={"application_name": self.application_name},
            )

        self._pool = await self.retrying("connect", connect, announce=True)
        self._writers = WriterConnections(self.dsn, c.connect_timeout, f"slice-journal writer {self.writer_id}"[:63])
        try:
            table = await self.retrying(
                "connect",
                self._on_pool(lambda conn: conn.fetchval(self.sql.table_exists, self.sql.t("event_journal"))),
                announce=True,
            )
        except BaseException:
            await self.close()
            raise
        if table is None:
            await self.close()
            raise ConfigurationError(
                f"{self.target} has no event_journal table in schema {self.settings.schema!r}: run `journal migrate` "
                "(or `alembic upgrade head`) against this database first"
            )

    async def close(self) -> None:
        if self._writers is not None:
            await self._writers.close()
            self._writers = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise JournalUnavailable("the journal is not open")
        return self._pool

    @property
    def writers(self) -> WriterConnections:
        if self._writers is None:
            raise JournalUnavailable("the journal is not open")
        return self._writers

    async def run(self, what: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        """``fn`` on a pooled connection, retried on transient failures (it must be idempotent);
        driver errors come out as the library's (:func:`~.errors.driver_error`)."""
        return await self.retrying(what, self._on_pool(fn))

    def _on_pool(self, fn: Callable[[Any], Awaitable[T]]) -> Callable[[], Awaitable[T]]:
        async def op() -> T:
            try:
                async with self.pool.acquire() as conn:
                    try:
                        return await fn(conn)
                    except asyncpg.exceptions.InternalClientError:
                        conn.terminate()
                        raise
            except asyncpg.exceptions.InternalClientError as e:
                # A pooled connection left in a bad state by a killed backend: it is dropped;
                # retry on another one.
                raise ConnectionError(f"connection in a bad state: {e}") from e

        return op

    async def retrying(self, what: str, op: Callable[[], Awaitable[T]], *, announce: bool = False) -> T:
        return await with_retries(
            what, self.settings.retry, op, target=self.target, connect_timeout=self.settings.connection.connect_timeout,
            announce=announce,
        )  # fmt: skip

    async def fetch(self, what: str, query: str, *args: Any) -> list[asyncpg.Record]:
        rows: list[asyncpg.Record] = await self.run(what, lambda conn: conn.fetch(query, *args))
        return rows

    async def fetchval(self, what: str, query: str, *args: Any) -> Any:
        rows = await self.fetch(what, query, *args)
        return rows[0][0] if rows else None

    async def execute(self, what: str, query: str, *args: Any) -> str:
        status: str = await self.run(what, lambda conn: conn.execute(query, *args))
        return status


async def connect(dsn: str, settings: JournalSettings, *, what: str = "connect", **kwargs: Any) -> asyncpg.Connection:
    """One connection outside the pool (a command's, a tool's), with the journal's connect timeout,
    retries (announced: a person is waiting) and error mapping."""
    target = asyncpg_dsn(dsn)

    async def attempt() -> asyncpg.Connection:
        return await asyncpg.connect(target, timeout=settings.connection.connect_timeout, **kwargs)

    conn: asyncpg.Connection = await with_retries(
        what, settings.retry, attempt, target=target_of(target),
        connect_timeout=settings.connection.connect_timeout, announce=True,
    )  # fmt: skip
    return conn


class PostgresPart:
    """A concern of the Postgres backend over the shared connections. The backend inherits the
    parts that make up its interface (writes, reads, snapshots, info) and composes the others."""

    def __init__(self, conns: PostgresConnections) -> None:
        self.conns = conns
        self.settings = conns.settings
        self.sql = conns.sql

    @property
    def pool(self) -> asyncpg.Pool:
        return self.conns.pool
