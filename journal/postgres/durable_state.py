"""The durable state store on PostgreSQL: ``durable_state`` rows by persistence id
(:class:`~journal.backend.DurableStateStore`; SQL in :mod:`.state_statements`)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, cast

from ..backend import StateColumn, StateOutcome, StateRow, StateTransaction, StoredEvent, StoredState, stored_event
from ..errors import ConfigurationError, JournalUnavailable, SliceRangeMoved
from ..ids import slice_for
from ..serialization import Serialized
from .connections import PostgresConnections, PostgresPart
from .errors import cause_of, driver_error, is_transient, mapped_errors
from .slice_reader import PostgresSliceReader
from .state_statements import COLUMNS_OF, KEYED_BY_PID, STATES, StateStatements, column_writes

log = logging.getLogger(__name__)

TOMBSTONE_SER_ID = 0
"""``state_ser_id`` of a deleted state's row, as the plugin writes it (empty payload, manifest '')."""


class PostgresDurableState(PostgresPart):
    """Gets, upserts and deletes of ``durable_state`` over the journal's pool."""

    def __init__(self, conns: PostgresConnections) -> None:
        super().__init__(conns)
        self.statements = StateStatements(self.settings.schema)
        self._changes = PostgresStateChanges(conns)
        self._column_writes: dict[tuple[StateColumn, ...], list[tuple[str, list[int]]]] = {}

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
        in_transaction: StateTransaction | None = None,
    ) -> list[StateOutcome]:
        """The rows in one statement (autocommit, or in a transaction with ``in_transaction``
        after it); a refused row gets the revision stored now."""
        epoch = self.conns.epoch
        uniform, params = _params(rows, epoch)
        sql = self.statements.upsert_uniform if uniform else self.statements.upsert
        with mapped_errors("durable state upsert", self.conns.target):  # nothing sent yet
            conn = await self.pool.acquire()
        server_pid = conn.get_server_pid()
        try:
            if in_transaction is None:
                return await self._upsert(conn, rows, sql, params)
            async with conn.transaction():
                out = await self._upsert(conn, rows, sql, params)
                await in_transaction(conn, rows, out)
                return out
        except Exception as e:
            if is_transient(e) or conn.is_closed():  # sent, maybe committed: read back what happened
                log.warning("durable state upsert interrupted (%s), resolving its outcome", e)
                return await self._resolve(rows, server_pid, epoch, e)
            error = self._failure(e)
            if error is e:  # the library's own errors, a handler's
                raise
            raise error from e
        finally:
            await self._release(conn)

    async def _release(self, conn: Any) -> None:
        """Back to the pool. A connection that broke meanwhile (the answer to the pool's reset
        lost) is terminated by asyncpg, which then raises: the upsert's outcome, returned or
        raised, stands."""
        try:
            await self.pool.release(conn)
        except Exception as e:
            if not (is_transient(e) or conn.is_closed()):
                raise
            log.debug("durable state upsert: its connection broke on release (%s), terminated", e)

    async def _upsert(
        self, conn: Any, rows: Sequence[StateRow], sql: str, params: tuple[Any, ...]
    ) -> list[StateOutcome]:
        ns, stamps = await conn.fetchrow(sql, *params)
        out = _by_ordinal(len(rows), ns, stamps)
        refused = [i for i, ts in enumerate(out) if ts is None]
        if refused:  # read after the statement: the revision a racing writer committed
            pids = [rows[i].persistence_id for i in refused]
            found = {r["persistence_id"]: r["revision"] for r in await conn.fetch(self.statements.revisions, pids)}
            for i in refused:
                out[i] = found.get(rows[i].persistence_id)
        return out

    async def _resolve(
        self, rows: Sequence[StateRow], server_pid: int, epoch: int, cause: Exception
    ) -> list[StateOutcome]:
        """The outcome of each row of an upsert whose answer was lost, from the rows read back
        once its server process has settled (its transaction is then final): see :func:`_resolved`."""
        pids = [r.persistence_id for r in rows]
        slices = sorted({r.slice for r in rows})
        try:
            await self.conns.run("durable state resolve", lambda c: self._settle(c, server_pid))
            found = await self.conns.fetch("durable state resolve", self.statements.read_back, pids, epoch, slices)
        except SliceRangeMoved as e:  # the range left this database meanwhile, with its rows
            raise JournalUnavailable(
                f"durable state upsert: its answer was lost and its slices moved to another database meanwhile "
                f"({e}); it may or may not be written: get the state to see its revision",
                outcome_unknown=True,
            ) from cause
        except JournalUnavailable as e:
            raise JournalUnavailable(
                f"durable state upsert: {self.conns.target} unavailable ({cause_of(cause)}) and its outcome "
                f"could not be read back ({e}); it may or may not be written: get the state to see its revision",
                outcome_unknown=True,
            ) from cause
        by_pid = {r["persistence_id"]: r for r in found}
        return [_resolved(row, by_pid.get(row.persistence_id)) for row in rows]

    async def _settle(self, conn: Any, server_pid: int, patience: float = 10.0) -> None:
        """Wait until the interrupted upsert's server process is idle or gone. A process still
        busy after ``patience`` (or a pid reused meanwhile) leaves the outcome unknown."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + patience
        while await conn.fetchval(self.statements.busy, server_pid):
            if loop.time() > deadline:
                raise JournalUnavailable(f"its server process {server_pid} is still busy after {patience:g} s")
            await asyncio.sleep(0.01)

    def _failure(self, e: Exception) -> BaseException:
        return driver_error("durable state upsert", self.conns.target, e)

    async def delete_tombstones(
        self, before: datetime, *, dry_run: bool = False, batch: int = 10_000, slices: tuple[int, int] = (0, 1023)
    ) -> int:
        """Delete the tombstones of ``slices`` (a range) written before ``before``, ``batch`` at a
        time (each its own transaction, after the owner check for deletes: SliceRangeMoved while
        the range is moved); how many (``dry_run``: how many would be)."""
        lo, hi = slices
        if dry_run:
            n: int = await self.conns.fetchval(
                "durable state tombstones", self.statements.count_tombstones, before, lo, hi, self.conns.epoch
            )
            return n
        deleted = 0
        while True:
            status = await self._deleting(
                "durable state tombstones", range(lo, hi + 1), self.statements.delete_tombstones, before, batch, lo, hi
            )
            n = int(status.rsplit(" ", 1)[1])
            deleted += n
            if n < batch:
                return deleted

    async def check_columns(self, columns: Sequence[StateColumn]) -> None:
        tables = sorted({c.table or "durable_state" for c in columns})
        schema = self.settings.schema
        found = await self.conns.fetch("additional columns", COLUMNS_OF, schema, tables)
        have = {(r[0], r[1]) for r in found}
        keyed = {r[0] for r in await self.conns.fetch("additional columns", KEYED_BY_PID, schema, tables)}
        for c in columns:
            table = c.table or "durable_state"
            if not any(t == table for t, _ in have):
                raise ConfigurationError(
                    f"additional column {table}.{c.column}: no table {schema}.{table} in {self.conns.target}"
                )
            if (table, c.column) not in have:
                raise ConfigurationError(
                    f"additional column {table}.{c.column}: {schema}.{table} has no column {c.column!r} in "
                    f"{self.conns.target} (add it: ALTER TABLE {schema}.{table} ADD COLUMN {c.column} ...)"
                )
            if c.table is not None and table not in keyed:
                raise ConfigurationError(
                    f"additional column {table}.{c.column}: {schema}.{table} needs persistence_id as its primary key"
                )

    async def write_columns(self, conn: Any, persistence_id: str, values: Sequence[tuple[StateColumn, Any]]) -> None:
        key = tuple(c for c, _ in values)
        statements = self._column_writes.get(key)
        if statements is None:
            statements = self._column_writes[key] = column_writes(self.settings.schema, list(key))
        for sql, its in statements:
            await conn.execute(sql, persistence_id, *(values[i][1] for i in its))

    async def hard_delete_state(self, persistence_id: str) -> bool:
        """Remove the pid's row, after the owner check for deletes (a moving range's wait)."""
        status = await self._deleting(
            "durable state hard delete", (slice_for(persistence_id),), self.statements.hard_delete, persistence_id
        )
        return status != "DELETE 0"

    async def _deleting(self, what: str, slices: Iterable[int], sql: str, *args: Any) -> str:
        checked = list(slices)

        async def op(conn: Any) -> str:
            async with conn.transaction():
                await conn.execute(self.statements.delete_check, self.conns.epoch, checked)
                status: str = await conn.execute(sql, *args)
                return status

        return await self.conns.run(what, op)


def _resolved(row: StateRow, found: Any) -> StateOutcome:
    """Decided by the revision read back: the row at ours with our payload and tags is ours
    (written); at ours with another's, another writer took the revision (a conflict); at the one
    before (none, for revision 1), ours is not written; below it (or none), ours was refused (a
    conflict: revisions only grow). Above ours cannot be told apart from ours written and then
    changed again, so it stays unknown. (A hard delete racing the upsert is outside this: it
    removes what it would tell.)"""
    pid, revision = row.persistence_id, row.revision
    stored: int | None = None if found is None else found["revision"]
    if stored == revision:
        st = row.state
        mine = (st.ser_id, st.manifest, st.payload) if st else (TOMBSTONE_SER_ID, "", b"")
        theirs = (found["state_ser_id"], found["state_ser_manifest"] or "", bytes(found["state_payload"] or b""))
        if mine == theirs and tuple(found["tags"] or ()) == row.tags:
            written: datetime = found["db_timestamp"]
            return written
        return stored
    if (stored is None and revision == 1) or stored == revision - 1:
        return JournalUnavailable(
            f"durable state upsert of {pid!r} at revision {revision}: its answer was lost and it is known "
            "not written (the stored revision is the one before): upsert it again"
        )
    if stored is None or stored < revision:  # revisions only grow: ours was refused
        return stored
    return JournalUnavailable(
        f"durable state upsert of {pid!r} at revision {revision}: its answer was lost and the stored revision "
        f"{stored} cannot tell whether it was written (a later write may have followed it)",
        outcome_unknown=True,
    )


def _by_ordinal(n: int, ns: list[int] | None, stamps: list[datetime] | None) -> list[StateOutcome]:
    """Each of ``n`` rows' db_timestamp, or None where it was not written, from the upsert's
    answer (the written rows' ordinals and stamps); as they are when every row was written in order."""
    if stamps is not None and ns == list(range(1, n + 1)):
        return list(stamps)
    out: list[StateOutcome] = [None] * n
    for i, ts in zip(ns or (), stamps or (), strict=True):
        out[i - 1] = ts
    return out


def _params(rows: Sequence[StateRow], epoch: int) -> tuple[bool, tuple[Any, ...]]:
    """The upsert's parameters: of :attr:`.StateStatements.upsert_uniform` (True) when the rows
    share one entity type, serializer id and manifest and have no tags (four arrays, not eight:
    asyncpg checks each element of each array it sends), else of ``upsert``."""
    pids, slices, revisions = [r.persistence_id for r in rows], [r.slice for r in rows], [r.revision for r in rows]
    states = [r.state for r in rows]
    uniform = _uniform(rows, states)
    if uniform is not None:
        entity_type, ser_id, manifest = uniform
        payloads = [s.payload for s in cast(list[Serialized], states)]
        return True, (pids, slices, entity_type, revisions, ser_id, manifest, payloads, epoch)
    return False, (
        pids,
        slices,
        [r.entity_type for r in rows],
        revisions,
        [s.ser_id if s else TOMBSTONE_SER_ID for s in states],
        [s.manifest if s else "" for s in states],
        [s.payload if s else b"" for s in states],
        [json.dumps(r.tags) if r.tags else None for r in rows],
        epoch,
    )


def _uniform(rows: Sequence[StateRow], states: list[Serialized | None]) -> tuple[str, int, str] | None:
    """The one entity type, serializer id and manifest of untagged rows that all have a state, or None."""
    if None in states or any(r.tags for r in rows):
        return None
    present = cast(list[Serialized], states)
    kinds = ({r.entity_type for r in rows}, {s.ser_id for s in present}, {s.manifest for s in present})
    if any(len(k) != 1 for k in kinds):
        return None
    (entity_type,), (ser_id,), (manifest,) = kinds
    return entity_type, ser_id, manifest


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
