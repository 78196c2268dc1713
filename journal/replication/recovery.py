"""Disaster recovery of a location's logs from its peers, in the one order that is safe.

A location whose database was lost starts again on an empty one while its application may go on
writing. Its old log positions were read by its peers, so its new events must get positions past
them, or an identity ``(location, position)`` would name two events. So, in this order:

1. the logs are flagged recovering and the recovery guard is installed (one transaction): from
   here on nothing stamps a local event, and local writes are refused
   (:mod:`journal.postgres.recovery_guard`); the flag survives a crash, so an interrupted
   recovery is resumed, never skipped;
2. every connection is asked what it holds of this location (its progress reading this log,
   and its version vector's entry for this location: events of ours it got by another path);
   the log positions are moved past the greatest;
3. everything is pulled from every connection until caught up (these writes are what is
   reported as recovered);
4. snapshots covering events no peer had are deleted, the flag and the guard go.

Only then are local events stamped: the ones written before the recovery began (they are in the
table, unstamped) get new positions and a vector time that covers everything recovered. The
endpoint runs no pull and no stamping of its own from before step 1 until step 4
(:class:`StepGate`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from ..backend import ReplicationStore
from .config import EndpointConfig
from .replicator import LogSource, Replicator


class StepGate:
    """Steps run while the gate is open; :meth:`close` returns once no step is running."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.asynccontextmanager
    async def step(self) -> AsyncIterator[None]:
        await self._open.wait()
        self._running += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._running -= 1
            if not self._running:
                self._idle.set()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    async def close(self) -> None:
        self._open.clear()
        await self._idle.wait()

    def open(self) -> None:
        self._open.set()


def held_of(location: str, info: Mapping[str, Any], log_name: str) -> int:
    """How far a peer (its ``info``) holds ``location``'s log: what it has read of it, or got of
    it by another path (its version vector's entry), whichever is further."""
    log = info.get("logs", {}).get(log_name, {})
    return max(int(log.get("progress", {}).get(location, 0)), int(log.get("version_vector", {}).get(location, 0)))


async def recover_logs(
    store: ReplicationStore, config: EndpointConfig, sources: Sequence[LogSource], infos: Sequence[Any]
) -> dict[str, int]:
    """Steps 2 to 4 above (the caller has done step 1 and asked every connection's ``info``):
    returns the events written per log while catching up."""
    for conn, info in zip(config.connections, infos, strict=True):
        for name in config.logs_of(conn):
            await store.reserve_positions(name, held_of(config.location, info, name))
    recovered = dict.fromkeys(config.logs, 0)
    for conn, source in zip(config.connections, sources, strict=True):
        for name in config.logs_of(conn):
            replicator = Replicator(store, source, name, batch_size=config.batch_size, application=config.application)
            recovered[name] += await replicator.catch_up()
    for name in config.logs:
        await store.delete_invalid_snapshots(name)
    await store.end_recovery(config.logs)
    return recovered
