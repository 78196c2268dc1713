"""The group commit's own connections: a free list, no pool bookkeeping.

At most ``max_in_flight`` batches are written at once, so a handful of long-lived connections
is all the write path needs; taking one is a ``deque.pop``. A connection whose state is unknown
(a statement interrupted or cancelled) is closed and replaced on the next take.
"""

from __future__ import annotations

import contextlib
from collections import deque

import asyncpg

from .timestamp_rule import WRITER_SETTING, WRITER_VALUE


class WriterConnections:
    def __init__(self, dsn: str, connect_timeout: float, application_name: str) -> None:
        self._dsn = dsn
        self._timeout = connect_timeout
        self.application_name = application_name
        """Set on every write connection, so an interrupted write's server process can be found."""
        self._free: deque[asyncpg.Connection] = deque()
        self._all: set[asyncpg.Connection] = set()
        self._closed = False

    async def take(self) -> asyncpg.Connection:
        while self._free:
            conn = self._free.pop()
            if not conn.is_closed():
                return conn
            self._all.discard(conn)
        conn = await asyncpg.connect(
            self._dsn,
            timeout=self._timeout,
            # these writes obey the write rule themselves: the database's rule trigger skips them
            server_settings={"application_name": self.application_name, WRITER_SETTING: WRITER_VALUE},
        )
        self._all.add(conn)
        return conn

    def give_back(self, conn: asyncpg.Connection, *, broken: bool = False) -> None:
        if broken or self._closed or conn.is_closed() or conn.is_in_transaction():
            self._all.discard(conn)
            with contextlib.suppress(Exception):
                conn.terminate()
            return
        self._free.append(conn)

    async def close(self) -> None:
        self._closed = True
        for conn in list(self._all):
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)
        self._all.clear()
        self._free.clear()
