"""Journal notifications on PostgreSQL: one LISTEN connection, supervised.

The write path sends ``pg_notify`` inside its statement (delivered on commit); live slice queries
wake on it. A notification sent while the listener is reconnecting is lost, so ``on_reconnect``
tells the queries to poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import asyncpg

from ..conditions import Condition
from ..settings import JournalSettings
from ..waits import wait_set
from .errors import is_transient
from .statements import notify_channel

log = logging.getLogger("journal.postgres.slices")


class PostgresListener:
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
                conn = await asyncpg.connect(self._dsn, timeout=self._settings.connection.connect_timeout)
                conn.add_termination_listener(lambda _c, ev=lost: ev.set())
                await conn.add_listener(self._channel, self._notified)
                self.connection_pid = conn.get_server_pid()
                self.connected.set()
                failures = 0
                self.down.clear("notification listener connected again")
                self._on_reconnect()  # notifications sent while not listening are lost: poll now
                while not lost.is_set():
                    await wait_set(lost, 5.0)
                    if not lost.is_set() and conn.is_closed():
                        break
                log.warning("notification listener connection lost; reconnecting")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not is_transient(e):
                    log.error("notification listener failed: %s", e)
                delay = self._settings.retry.backoff(failures)
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
