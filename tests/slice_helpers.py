"""Helpers of the slice query tests: late writers that follow the journal's own write rule."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

import asyncpg

from journal import EventEnvelope, Journal
from journal.postgres.backend import PostgresBackend
from journal.postgres.dsn import asyncpg_dsn
from journal.write_batch import WriteBatch

T = TypeVar("T")


def request(journal: Journal, pid: str, events: Sequence[Any]) -> WriteBatch:
    """One call, checked and serialized as ``persist`` would (the journal's one validator)."""
    return journal._validator.call(pid, list(events))


class LateWriter:
    """An explicit transaction running the journal's own insert statement, committed later."""

    def __init__(self, journal: Journal, dsn: str) -> None:
        backend = journal.backend
        assert isinstance(backend, PostgresBackend)
        self.backend = backend
        self.dsn = asyncpg_dsn(dsn)
        self.conn: asyncpg.Connection | None = None
        self.tr: Any = None

    async def begin_and_write(self, requests: Sequence[WriteBatch]) -> list[dict[str, Any]]:
        self.conn = await asyncpg.connect(self.dsn)
        self.tr = self.conn.transaction()
        await self.tr.start()
        # The backend's own statement (not a copy of the SQL), inside this open transaction.
        out: list[dict[str, Any]] = []
        for r in requests:
            res = await self.backend.write_on(self.conn, r)
            out.append(
                {"persistence_id": r.persistence_ids[0],
                 "first_seq_nr": res.first_seq_nrs[0], "n": r.events, "db_timestamp": res.db_timestamps[0]}
            )  # fmt: skip
        return out

    async def commit(self) -> None:
        assert self.conn is not None
        await self.tr.commit()
        await self.conn.close()

    async def rollback(self) -> None:
        assert self.conn is not None
        await self.tr.rollback()
        await self.conn.close()


async def collect(it: AsyncIterator[EventEnvelope]) -> list[EventEnvelope]:
    return [e async for e in it]


class Consumer:
    """Runs a live iterator in a task and records what it delivers."""

    def __init__(self, it: AsyncIterator[EventEnvelope]) -> None:
        self.it = it
        self.got: list[EventEnvelope] = []
        self.arrived: list[float] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for e in self.it:
            self.got.append(e)
            self.arrived.append(time.monotonic())

    @property
    def events(self) -> list[EventEnvelope]:
        return [e for e in self.got if e.source != "heartbeat"]

    async def stop(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass
        aclose = getattr(self.it, "aclose", None)
        if aclose is not None:
            await aclose()
