"""The durable state store on PostgreSQL: ``durable_state`` rows by persistence id
(:class:`~journal.backend.DurableStateStore`; SQL in :mod:`.state_statements`)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from ..backend import StateOutcome, StateRow, StoredEvent, StoredState, stored_event
from ..errors import JournalUnavailable
from ..serialization import Serialized
from .connections import PostgresConnections, PostgresPart
from .errors import cause_of, driver_error, is_transient, mapped_errors
from .slice_reader import PostgresSliceReader
from .state_statements import STATES, StateStatements

TOMBSTONE_SER_ID = 0
"""``state_ser_id`` of a deleted state's row, as the plugin writes it (empty payload, manifest '')."""


class PostgresDurableState(PostgresPart):
    """Gets, upserts and deletes of ``durable_state`` over the journal's pool."""

    def __init__(self, conns: PostgresConnections) -> None:
        super().__init__(conns)
        self.statements = StateStatements(self.settings.schema)
        self._changes = PostgresStateChanges(conns)

    def changes(self) -> PostgresStateChanges:
        """The slice reads of ``durable_state`` (changes by slices)."""
        return self._changes

    async def get_state(self, persistence_id: str) -> StoredState | None:
        rows = await self.conns.fetch("durable state get", self.statements.get, persistence_id)
        if not rows:
            return None
        r = rows[0]
        ser_id = r["state_ser_id"]
        state = None
        if ser_id != TOMBSTONE_SER_ID:
            state = Serialized(ser_id, r["state_ser_manifest"] or "", r["state_payload"])
        return StoredState(persistence_id, r["revision"], r["db_timestamp"], state, tuple(r["tags"] or ()))

    async def upsert_states(
        self,
        rows: Sequence[StateRow],
        in_transaction: Callable[[Any, list[StateOutcome]], Awaitable[None]] | None = None,
    ) -> list[StateOutcome]:
        """The rows in one statement (autocommit, or in a transaction with ``in_transaction``
        after it); a refused row gets the revision stored now."""
        params = _params(rows, self.conns.epoch)
        with mapped_errors("durable state upsert", self.conns.target):  # nothing sent yet
            conn = await self.pool.acquire()
        try:
            if in_transaction is None:
                return await self._upsert(conn, rows, params)
            async with conn.transaction():
                out = await self._upsert(conn, rows, params)
                await in_transaction(conn, out)
                return out
        except Exception as e:
            error = self._failure(e)
            if error is e:  # the library's own errors, a handler's
                raise
            raise error from e
        finally:
            await self.pool.release(conn)

    async def _upsert(self, conn: Any, rows: Sequence[StateRow], params: tuple[Any, ...]) -> list[StateOutcome]:
        answer = await conn.fetch(self.statements.upsert, *params)
        out: list[StateOutcome] = [r["ts"] for r in answer]
        refused = [i for i, ts in enumerate(out) if ts is None]
        if refused:  # read after the statement: the revision a racing writer committed
            pids = [rows[i].persistence_id for i in refused]
            found = {r["persistence_id"]: r["revision"] for r in await conn.fetch(self.statements.revisions, pids)}
            for i in refused:
                out[i] = found.get(rows[i].persistence_id)
        return out

    def _failure(self, e: Exception) -> BaseException:
        if is_transient(e):  # sent, maybe committed: never guessed
            return JournalUnavailable(
                f"durable state upsert: {self.conns.target} unavailable ({cause_of(e)}); "
                "it may or may not be written: get the state to see its revision",
                outcome_unknown=True,
            )
        return driver_error("durable state upsert", self.conns.target, e)

    async def hard_delete_state(self, persistence_id: str) -> bool:
        status = await self.conns.execute("durable state hard delete", self.statements.hard_delete, persistence_id)
        return status != "DELETE 0"


def _params(rows: Sequence[StateRow], epoch: int) -> tuple[Any, ...]:
    states = [r.state for r in rows]
    return (
        [r.persistence_id for r in rows],
        [r.slice for r in rows],
        [r.entity_type for r in rows],
        [r.revision for r in rows],
        [s.ser_id if s else TOMBSTONE_SER_ID for s in states],
        [s.manifest if s else "" for s in states],
        [s.payload if s else b"" for s in states],
        [json.dumps(r.tags) if r.tags else None for r in rows],
        epoch,
    )


class PostgresStateChanges(PostgresSliceReader):
    """The slice reads over ``durable_state`` (:data:`.state_statements.STATES`), for the journal's
    slice query algorithm. A pid has one row: no earlier revisions to read by pid (a revision
    skipped is the guarantee, not a gap), and a backtracking read loads the row only while it is
    still at the revision found (a later one is found at its own, later, timestamp)."""

    def __init__(self, conns: PostgresConnections) -> None:
        super().__init__(conns, STATES)
        self._load = StateStatements(conns.settings.schema).load

    async def read_events(self, persistence_id: str, from_seq_nr: int, to_seq_nr: int, limit: int) -> list[StoredEvent]:
        return []

    async def timestamp_of(self, persistence_id: str, seq_nr: int) -> datetime | None:
        return None

    async def load_event(self, persistence_id: str, seq_nr: int) -> StoredEvent | None:
        rows = await self.conns.fetch("load state", self._load, persistence_id, seq_nr)
        return stored_event(rows[0]) if rows else None
