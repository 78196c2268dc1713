"""Slice query operations on PostgreSQL: pages, the horizon reading, the notification listener.

Composed into :class:`~journal.postgres.backend.PostgresBackend` (which delegates to it), so the
slice-query SQL and its connection handling stay in one small module.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import asyncpg

from ..backend import HorizonReading, StoredEvent, WriterInProgress
from ..conditions import Condition
from ..serialization import Serialized
from ..settings import JournalSettings
from .errors import is_transient, with_retries
from .slice_queries import SliceStatements
from .statements import notify_channel

log = logging.getLogger("journal.postgres.slices")


class PostgresSliceReader:
    """Reads of the slice queries over a pool; ``row_to_event`` maps rows to StoredEvent."""

    def __init__(
        self,
        pool: Callable[[], asyncpg.Pool],
        dsn: str,
        settings: JournalSettings,
        row_to_event: Callable[..., StoredEvent],
    ) -> None:
        self._pool = pool
        self._dsn = dsn
        self._settings = settings
        self._row = row_to_event
        self.sql = SliceStatements(settings.schema)
        self._slice_lists: dict[tuple[int, int], list[int]] = {}
        self._page = {
            True: self.sql.page(with_payload=True),
            False: self.sql.page(with_payload=False),
        }

    def _slices(self, lo: int, hi: int) -> list[int]:
        key = (lo, hi)
        got = self._slice_lists.get(key)
        if got is None:
            got = self._slice_lists[key] = list(range(lo, hi + 1))
        return got

    async def _fetch(self, what: str, query: str, *args: Any) -> list[asyncpg.Record]:
        async def op() -> list[asyncpg.Record]:
            try:
                async with self._pool().acquire() as conn:
                    try:
                        return await conn.fetch(query, *args)
                    except asyncpg.exceptions.InternalClientError:
                        conn.terminate()
                        raise
            except asyncpg.exceptions.InternalClientError as e:
                # A pooled connection left in a bad state by a killed backend: it is dropped;
                # retry on another one.
                raise ConnectionError(f"connection in a bad state: {e}") from e

        return await with_retries(what, self._settings.retry, op)

    async def _fetchval(self, what: str, query: str, *args: Any) -> Any:
        rows = await self._fetch(what, query, *args)
        return rows[0][0] if rows else None

    async def read_slice_page(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        from_timestamp: datetime,
        seen: Mapping[str, int],
        to_timestamp: datetime,
        limit: int,
        *,
        with_payload: bool = True,
    ) -> list[StoredEvent]:
        rows = await self.read_slice_rows(
            entity_type, min_slice, max_slice, from_timestamp, seen, to_timestamp, limit,
            with_payload=with_payload,
        )  # fmt: skip
        return [_stored(r) for r in rows]

    async def read_slice_rows(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        from_timestamp: datetime,
        seen: Mapping[str, int],
        to_timestamp: datetime,
        limit: int,
        *,
        with_payload: bool = True,
    ) -> list[Any]:
        return await self._fetch(
            "slice page",
            self._page[with_payload],
            entity_type, self._slices(min_slice, max_slice), from_timestamp, to_timestamp,
            list(seen.keys()), list(seen.values()), limit,
        )  # fmt: skip

    async def next_slice_timestamp(
        self,
        entity_type: str,
        min_slice: int,
        max_slice: int,
        from_timestamp: datetime,
        to_timestamp: datetime,
    ) -> datetime | None:
        value: datetime | None = await self._fetchval(
            "next slice timestamp", self.sql.next_timestamp,
            entity_type, min_slice, max_slice, from_timestamp, to_timestamp,
        )  # fmt: skip
        return value

    async def horizon_reading(self) -> HorizonReading:
        rows = await self._fetch("horizon", self.sql.horizon, self.sql.table_name)
        writers = tuple(
            WriterInProgress(vxid=r["vxid"], pid=r["pid"], xact_start=r["xact_start"])
            for r in rows
            if r["vxid"] is not None
        )
        return HorizonReading(
            now=rows[0]["now"], writers=writers, prepared=int(rows[0]["prepared"])
        )

    async def db_now(self) -> datetime:
        value: datetime = await self._fetchval("db now", self.sql.db_now)
        return value

    async def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        value: datetime | None = await self._fetchval(
            "timestamp of", self.sql.timestamp_of, persistence_id, seq_nr
        )
        return value

    async def load_event(self, persistence_id: str, seq_nr: int) -> StoredEvent | None:
        rows = await self._fetch("load event", self.sql.load_event, persistence_id, seq_nr)
        return self._row(rows[0]) if rows else None

    async def listen(
        self, on_notify: Callable[[str], None], on_reconnect: Callable[[], None]
    ) -> _Listener:
        listener = _Listener(self._dsn, self._settings, on_notify, on_reconnect)
        listener.start()
        return listener


def _stored(r: asyncpg.Record) -> StoredEvent:
    """A page row (columns of ``slice_queries._PAYLOAD_COLUMNS``, by position) as a StoredEvent;
    the payload is None for payload-free pages."""
    meta = None
    if r[10] is not None:
        meta = Serialized(r[10], r[11] or "", r[12] or b"")
    tags = r[9]
    return StoredEvent(
        r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], tuple(tags) if tags else (), meta, r[13]
    )


class _Listener:
    """One LISTEN connection, supervised: reconnects with backoff when it drops."""

    def __init__(
        self,
        dsn: str,
        settings: JournalSettings,
        on_notify: Callable[[str], None],
        on_reconnect: Callable[[], None],
    ) -> None:
        self._dsn = dsn
        self._settings = settings
        self._channel = notify_channel(settings.schema)
        self._on_notify = on_notify
        self._on_reconnect = on_reconnect
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        self.connection_pid: int | None = None
        self.down = Condition(log, logging.WARNING)
        """Cannot connect: logged once, and when it connects again."""

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="journal-listener")

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        self._on_notify(str(payload))

    async def _run(self) -> None:
        failures = 0
        while True:
            lost = asyncio.Event()
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(
                    self._dsn, timeout=self._settings.connection.connect_timeout
                )
                conn.add_termination_listener(lambda _c, ev=lost: ev.set())
                await conn.add_listener(self._channel, self._notified)
                self.connection_pid = conn.get_server_pid()
                self.connected.set()
                failures = 0
                self.down.clear("notification listener connected again")
                self._on_reconnect()  # notifications sent while not listening are lost: poll now
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), timeout=5.0)
                    if not lost.is_set() and conn.is_closed():
                        break
                log.warning("notification listener connection lost; reconnecting")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not is_transient(e):
                    log.error("notification listener failed: %s", e)
                retry = self._settings.retry
                delay = min(retry.max_backoff, retry.initial_backoff * 2 ** min(failures, 30))
                failures += 1
                self.down.occurred("notification listener cannot connect (%s); retrying with backoff", e)
                await asyncio.sleep(delay)
            finally:
                self.connected.clear()
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(Exception):
                        await conn.close(timeout=1.0)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
