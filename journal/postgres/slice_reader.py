"""Slice query reads on PostgreSQL: pages by slice range and time, the next-timestamp probe, the
horizon reading and the notification listener (:class:`~journal.backend.SliceQueryBackend`).

The backend composes one (``PostgresBackend.slice_queries()``); it shares the backend's
connections and its reads by persistence id.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from ..backend import HorizonReading, PageRequest, SliceRange, StoredEvent, WriterInProgress, stored_event
from .connections import PostgresConnections
from .notifications import PostgresListener
from .reads import PostgresReads
from .slice_queries import EVENTS, SliceStatements, SliceTable


class PostgresSliceReader(PostgresReads):
    def __init__(self, conns: PostgresConnections, table: SliceTable = EVENTS) -> None:
        super().__init__(conns)
        self.slice_sql = SliceStatements(conns.settings.schema, table)
        self._slice_lists: dict[tuple[int, int], list[int]] = {}
        self._page = {
            True: self.slice_sql.page(with_payload=True),
            False: self.slice_sql.page(with_payload=False),
        }

    def _slices(self, lo: int, hi: int) -> list[int]:
        key = (lo, hi)
        got = self._slice_lists.get(key)
        if got is None:
            got = self._slice_lists[key] = list(range(lo, hi + 1))
        return got

    async def read_slice_page(
        self, slices: SliceRange, page: PageRequest, *, with_payload: bool = True
    ) -> list[StoredEvent]:
        return [stored_event(r) for r in await self.read_slice_rows(slices, page, with_payload=with_payload)]

    async def read_slice_rows(self, slices: SliceRange, page: PageRequest, *, with_payload: bool = True) -> list[Any]:
        seen = page.seen
        return await self.conns.fetch(
            "slice page",
            self._page[with_payload],
            slices.entity_type, self._slices(slices.min_slice, slices.max_slice), page.from_timestamp,
            page.to_timestamp, list(seen.keys()), list(seen.values()), page.limit, self.conns.epoch,
        )  # fmt: skip

    async def next_slice_timestamp(
        self, slices: SliceRange, from_timestamp: datetime, to_timestamp: datetime
    ) -> datetime | None:
        value: datetime | None = await self.conns.fetchval(
            "next slice timestamp", self.slice_sql.next_timestamp,
            slices.entity_type, slices.min_slice, slices.max_slice, from_timestamp, to_timestamp, self.conns.epoch,
        )  # fmt: skip
        return value

    async def horizon_reading(self) -> HorizonReading:
        rows = await self.conns.fetch("horizon", self.slice_sql.horizon, self.slice_sql.table_name)
        writers = tuple(
            WriterInProgress(vxid=r["vxid"], pid=r["pid"], xact_start=r["xact_start"])
            for r in rows
            if r["vxid"] is not None
        )
        return HorizonReading(now=rows[0]["now"], writers=writers, prepared=int(rows[0]["prepared"]))

    async def db_now(self) -> datetime:
        value: datetime = await self.conns.fetchval("db now", self.slice_sql.db_now)
        return value

    async def listen(self, on_notify: Callable[[str], None], on_reconnect: Callable[[], None]) -> PostgresListener:
        listener = PostgresListener(self.conns.dsn, self.settings, on_notify, on_reconnect)
        listener.start()
        return listener
