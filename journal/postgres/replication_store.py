"""SQL of replicated logs (issue 14): stamping local events, reading a log by position, writing a
replicated batch with its progress in one transaction.

Ordering argument (why "after position N" is a sound cursor here, although a PostgreSQL sequence
would not be): a log position is handed out only by a transaction that holds the row lock on the
log's ``replication_log`` row, and that lock is released after the transaction's commit became
visible. So position N+1 is never visible before position N, and a reader paging by position
never skips an event that commits late.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from itertools import repeat
from typing import Any

import asyncpg
import orjson

from ..buckets import bucket_millis
from ..errors import ConfigurationError, JournalUnavailable, LocationMismatch, ReplicationError, SequenceConflict
from ..ids import validate_entity_type
from ..replicated import ReplicatedEvent, WriteOutcome
from ..serialization import Serialized
from ..settings import validate_identifier
from ..vector_time import VectorTime
from ..write_batch import WriteBatch
from ..write_validation import replicated_batch
from . import recovery_guard
from .errors import is_transient, partition_refusal
from .replicated_insert import insert_replicated
from .statements import notify_groups
from .timestamp_rule import MARK_WRITER_LOCAL_SQL
from .writes import PostgresWrites

STAMP_LIMIT = 1000
"""Local events stamped per statement."""
SEQUENCE_RACE_ATTEMPTS = 3
"""Writes of a replicated batch that lost its sequence numbers to a local write, before giving up."""
PRIMARY_KEY = "event_journal_pkey"


class ReplicationStatements:
    """Every statement of the replicated logs, built once per schema (identifiers validated, values parameters)."""

    def __init__(self, schema: str) -> None:
        validate_identifier(schema, "schema")
        ej, rl, rp, rt, sn = (
            f'"{schema}".{t}'
            for t in (
                "event_journal",
                "replication_log",
                "replication_progress",
                "replication_target_progress",
                "snapshot",
            )
        )
        self.ensure_log = (
            f"INSERT INTO {rl} (log_name, location, log_seq_nr, version_vector) VALUES ($1, $2, 0, '{{}}') "
            f"ON CONFLICT (log_name) DO NOTHING"
        )
        self.log_row = f"SELECT location, log_seq_nr, version_vector, recovering FROM {rl} WHERE log_name = $1"
        self.set_recovering = f"UPDATE {rl} SET recovering = $2 WHERE log_name = $1"
        self.any_recovering = f"SELECT EXISTS (SELECT 1 FROM {rl} WHERE recovering)"
        self.recovering = f"SELECT EXISTS (SELECT 1 FROM {rl} WHERE recovering AND log_name = ANY($1::text[]))"
        self.lock_log = self.log_row + " FOR UPDATE"
        self.save_log = f"UPDATE {rl} SET log_seq_nr = $2, version_vector = $3 WHERE log_name = $1"
        self.ej = ej
        self.schema = schema
        self._inserts: dict[tuple[bool, bool], str] = {}
        self.origin_index = f'"{schema}".event_journal_origin_idx'
        self.stamp = (
            f"UPDATE {ej} e SET origin_location = s.origin, origin_seq_nr = s.origin_seq, "
            f"vector_time = s.vt::jsonb, log_seq_nr = s.log_seq "
            f"FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::bigint[]) "
            f"AS s(pid, seq_nr, origin, origin_seq, vt, log_seq) "
            f"WHERE e.persistence_id = s.pid AND e.seq_nr = s.seq_nr"
        )
        columns = (
            "persistence_id, event_ser_id, event_ser_manifest, event_payload, tags, meta_ser_id, "
            "meta_ser_manifest, meta_payload, origin_location, origin_seq_nr, vector_time, log_seq_nr, deleted"
        )
        self.read_log = (
            f"SELECT {columns} FROM {ej} WHERE entity_type = $1 AND log_seq_nr > $2 ORDER BY log_seq_nr LIMIT $3"
        )
        self.read_ids = (
            f"SELECT {columns} FROM {ej} e JOIN unnest($2::text[], $3::bigint[]) AS s(origin, origin_seq) "
            f"ON e.entity_type = $1 AND e.origin_location = s.origin AND e.origin_seq_nr = s.origin_seq "
            f"ORDER BY e.log_seq_nr"
        )
        self.stored_ids = (
            f"SELECT s.origin, s.origin_seq FROM unnest($2::text[], $3::bigint[]) AS s(origin, origin_seq) "
            f"WHERE EXISTS (SELECT 1 FROM {ej} e WHERE e.entity_type = $1 AND e.origin_location = s.origin "
            f"AND e.origin_seq_nr = s.origin_seq)"
        )
        self.progress = f"SELECT source_log_seq_nr FROM {rp} WHERE log_name = $1 AND source_location = $2"
        self.all_progress = f"SELECT source_location, source_log_seq_nr FROM {rp} WHERE log_name = $1"
        self.save_progress = (
            f"INSERT INTO {rp} (log_name, source_location, source_log_seq_nr, updated_at) "
            f"VALUES ($1, $2, $3, now()) ON CONFLICT (log_name, source_location) DO UPDATE "
            f"SET source_log_seq_nr = GREATEST({rp}.source_log_seq_nr, EXCLUDED.source_log_seq_nr), updated_at = now()"
        )
        self.entity_events = (
            f"SELECT event_ser_id, event_ser_manifest, event_payload, origin_location, origin_seq_nr, vector_time "
            f"FROM {ej} WHERE persistence_id = $1 AND log_seq_nr IS NOT NULL AND NOT deleted ORDER BY seq_nr"
        )
        self.save_target_progress = (
            f"INSERT INTO {rt} (log_name, target_location, log_seq_nr, updated_at) VALUES ($1, $2, $3, now()) "
            f"ON CONFLICT (log_name, target_location) DO UPDATE "
            f"SET log_seq_nr = GREATEST({rt}.log_seq_nr, EXCLUDED.log_seq_nr), updated_at = now()"
        )
        self.target_progress = f"SELECT target_location, log_seq_nr FROM {rt} WHERE log_name = $1"
        self.reserve = f"UPDATE {rl} SET log_seq_nr = GREATEST(log_seq_nr, $2) WHERE log_name = $1"
        self.delete_logically = (
            f"UPDATE {ej} SET deleted = true WHERE entity_type = $1 AND log_seq_nr <= $2 AND NOT deleted"
        )
        self.delete_physically = (
            f"DELETE FROM {ej} e WHERE e.entity_type = $1 AND e.deleted AND e.log_seq_nr <= $2 "
            f"AND e.seq_nr < (SELECT max(h.seq_nr) FROM {ej} h WHERE h.persistence_id = e.persistence_id)"
        )
        self.delete_invalid_snapshots = (
            f"DELETE FROM {sn} s WHERE s.entity_type = $1 AND s.seq_nr > "
            f"COALESCE((SELECT max(e.seq_nr) FROM {ej} e WHERE e.persistence_id = s.persistence_id), 0)"
        )
        self.event_ids = (
            f"SELECT origin_location, origin_seq_nr, count(*) AS n FROM {ej} WHERE entity_type = $1 "
            f"AND log_seq_nr IS NOT NULL GROUP BY origin_location, origin_seq_nr"
        )

        # a database's part of a partitioned location's log ($N::int[]: the slices it serves)
        self.read_log_within = (
            f"SELECT {columns} FROM {ej} WHERE entity_type = $1 AND log_seq_nr > $2 AND log_seq_nr <= $3 "
            f"AND slice = ANY($5::int[]) ORDER BY log_seq_nr LIMIT $4"
        )
        self.read_ids_within = (
            f"SELECT {columns} FROM {ej} e JOIN unnest($2::text[], $3::bigint[]) AS s(origin, origin_seq) "
            f"ON e.entity_type = $1 AND e.origin_location = s.origin AND e.origin_seq_nr = s.origin_seq "
            f"WHERE e.log_seq_nr <= $4 AND e.slice = ANY($5::int[]) ORDER BY e.log_seq_nr"
        )
        self.event_ids_within = (
            f"SELECT origin_location, origin_seq_nr, count(*) AS n FROM {ej} WHERE entity_type = $1 "
            f"AND log_seq_nr IS NOT NULL AND slice = ANY($2::int[]) GROUP BY origin_location, origin_seq_nr"
        )
        self.above = f"SELECT log_seq_nr, vector_time FROM {ej} WHERE entity_type = $1 AND log_seq_nr > $2"
        self.delete_logically_within = self.delete_logically + " AND slice = ANY($3::int[])"
        self.delete_physically_within = self.delete_physically + " AND e.slice = ANY($3::int[])"
        self.mark_recovering = (
            f"INSERT INTO {rl} (log_name, location, log_seq_nr, version_vector, recovering) "
            f"VALUES ($1, $2, 0, '{{}}', true) ON CONFLICT (log_name) DO UPDATE SET recovering = true"
        )
        self.unmark_recovering = f"DELETE FROM {rl} WHERE log_name = $1"

    def insert(self, *, notify: bool, tagged: bool) -> str:
        key = (notify, tagged)
        if key not in self._inserts:
            self._inserts[key] = insert_replicated(self.schema, notify=notify, tagged=tagged)
        return self._inserts[key]

    def unstamped(self, log_name: str) -> str:
        """The log's local events not stamped yet, in commit-visible order. The log name is a
        literal (quoted here), so even a generic plan matches the log's partial index."""
        return (
            f"SELECT persistence_id, seq_nr FROM {self.ej} WHERE entity_type = {_literal(log_name)} "
            f"AND log_seq_nr IS NULL ORDER BY db_timestamp, seq_nr, persistence_id LIMIT $1"
        )

    def unstamped_within(self, log_name: str) -> str:
        """:meth:`unstamped` of the slices ``$2`` only, with each event's slice and timestamp."""
        return (
            f"SELECT persistence_id, seq_nr, slice, db_timestamp FROM {self.ej} "
            f"WHERE entity_type = {_literal(log_name)} AND log_seq_nr IS NULL AND slice = ANY($2::int[]) "
            f"ORDER BY db_timestamp, seq_nr, persistence_id LIMIT $1"
        )

    def unstamped_index(self, log_name: str) -> str:
        return unstamped_index_sql(log_name, self.schema)


def unstamped_index_sql(log_name: str, schema: str = "public", *, concurrently: bool = False) -> str:
    """The partial index of a replicated log's events not stamped yet: only locations that
    replicate, and only for the logs they replicate, pay for it (see migration 0006). The
    endpoint creates it at start; ``concurrently`` gives the statement to build it beforehand
    on a large table without holding writes back."""
    validate_identifier(schema, "schema")
    name = "event_journal_unstamped_" + hashlib.blake2b(log_name.encode(), digest_size=6).hexdigest()
    how = "CONCURRENTLY " if concurrently else ""
    return (
        f'CREATE INDEX {how}IF NOT EXISTS "{name}" ON "{schema}".event_journal (db_timestamp, seq_nr, persistence_id) '
        f"WHERE entity_type = {_literal(log_name)} AND log_seq_nr IS NULL"
    )


def _literal(value: str) -> str:
    """A SQL string literal (standard_conforming_strings); log names carry no NUL (validated)."""
    validate_entity_type(value)
    return "'" + value.replace("'", "''") + "'"


def vector_time_of(value: Any) -> VectorTime:
    return VectorTime.from_json(orjson.loads(value) if isinstance(value, str | bytes) else value)


async def log_head(conn: Any, sql: str, log_name: str) -> asyncpg.Record:
    row: asyncpg.Record | None = await conn.fetchrow(sql, log_name)
    if row is None:
        raise ReplicationError(f"log {log_name!r} is not set up at this location (ensure_log first)")
    return row


def dump_vt(vt: VectorTime) -> str:
    return orjson.dumps(vt.to_json()).decode()


class PostgresReplicationStore:
    """The replicated logs of one location in one journal database (log name = entity type)."""

    def __init__(self, backend: PostgresWrites, location: str) -> None:
        self.backend = backend
        self.location = location
        self.sql = ReplicationStatements(backend.settings.schema)

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A pooled connection; the database being away (refused, lost, shutting down) becomes
        :class:`JournalUnavailable`, which the endpoint answers as gRPC ``UNAVAILABLE``; the owner
        check's refusal (a partitioned database) becomes :class:`SliceRangeMoved`."""
        try:
            async with self.backend.pool.acquire() as conn:
                yield conn
        except Exception as e:
            if is_transient(e):
                raise JournalUnavailable(f"location {self.location!r}: database unavailable: {e}") from e
            moved = partition_refusal(e)
            if moved is not None:  # the owner check of a partitioned database
                raise moved from e
            raise

    async def ensure_log(self, log_name: str) -> None:
        """Create the log's state row for this location; refuse a database of another location."""
        async with self.connection() as conn:
            try:
                await conn.execute(self.sql.ensure_log, log_name, self.location)
            except (asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError) as e:
                raise ConfigurationError(
                    "this database has no replication tables: run `journal migrate` (migration 0005) first"
                ) from e
            row = await log_head(conn, self.sql.log_row, log_name)
            await self.ensure_indexes(conn, log_name)
        if row["location"] != self.location:
            raise LocationMismatch(
                f"log {log_name!r} of this database belongs to location {row['location']!r}, not {self.location!r}"
            )

    async def ensure_indexes(self, conn: Any, log_name: str) -> None:
        """Refuse a database without the replication indexes; create the log's unstamped index."""
        if await conn.fetchval("SELECT to_regclass($1)", self.sql.origin_index) is None:
            raise ConfigurationError(
                "this database lacks the replication indexes: run `journal migrate` (migration 0006) first"
            )
        with contextlib.suppress(asyncpg.UniqueViolationError, asyncpg.DuplicateTableError):
            await conn.execute(self.sql.unstamped_index(log_name))  # another process won the race

    async def version_vector(self, log_name: str) -> VectorTime:
        async with self.connection() as conn:
            row = await conn.fetchrow(self.sql.log_row, log_name)
        return VectorTime() if row is None else vector_time_of(row["version_vector"])

    async def log_seq_nr(self, log_name: str) -> int:
        async with self.connection() as conn:
            row = await conn.fetchrow(self.sql.log_row, log_name)
        return 0 if row is None else int(row["log_seq_nr"])

    async def stamp(self, log_name: str, limit: int = STAMP_LIMIT) -> int:
        """Give local events not yet in the log (written by the plain journal) their position,
        origin and vector time, oldest first (the order of the slice queries). Returns how many.

        Nothing is stamped while the log is recovering: its positions are not yet past what the
        peers have read of this location, and its version vector does not yet hold what the
        location had; local events written before or during the recovery are stamped after it,
        at new positions, with a vector time that covers everything recovered."""
        async with self.connection() as conn, conn.transaction():
            head = await log_head(conn, self.sql.lock_log, log_name)
            if head["recovering"]:
                return 0
            pos, vv = int(head["log_seq_nr"]), vector_time_of(head["version_vector"])
            n, _, _ = await self._stamp_locked(conn, log_name, pos, vv, limit)
            return n

    async def _stamp_locked(
        self, conn: Any, log_name: str, pos: int, vv: VectorTime, limit: int
    ) -> tuple[int, int, VectorTime]:
        """:meth:`stamp` under the log row lock the caller holds, from the log's position and
        version vector: how many, and the position and version vector after them."""
        rows = await conn.fetch(self.sql.unstamped(log_name), limit)
        if not rows:
            return 0, pos, vv
        # never reuse a position of ours that the log (after a disaster recovery) has seen
        pos = max(pos, vv.get(self.location, 0))
        stamped = []
        for r in rows:
            pos += 1
            vv = vv.with_entry(self.location, pos)
            stamped.append((r["persistence_id"], r["seq_nr"], pos, vv))
        await conn.execute(self.sql.stamp, *stamp_columns(self.location, stamped))
        await conn.execute(self.sql.save_log, log_name, pos, dump_vt(vv))
        return len(rows), pos, vv

    async def read_log(self, log_name: str, after: int, limit: int) -> tuple[list[ReplicatedEvent], int]:
        """Events of the log after position ``after`` in log order, and the last position
        scanned (``after`` when none)."""
        async with self.connection() as conn:
            rows = await conn.fetch(self.sql.read_log, log_name, after, limit)
        return events_of(rows), (int(rows[-1]["log_seq_nr"]) if rows else after)

    async def read_ids(self, log_name: str, ids: Sequence[tuple[str, int]]) -> list[ReplicatedEvent]:
        """The log's events with these identities (origin location, origin seq nr), in log order."""
        async with self.connection() as conn:
            rows = await conn.fetch(self.sql.read_ids, log_name, [i[0] for i in ids], [i[1] for i in ids])
        return events_of(rows)

    async def missing_ids(self, log_name: str, ids: Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
        """Those of ``ids`` this location has not stored (in the order given)."""
        if not ids:
            return []
        async with self.connection() as conn:
            stored = await stored_ids(conn, self.sql, log_name, ids)
        return [i for i in ids if i not in stored]

    async def progress(self, log_name: str, source_location: str) -> int:
        async with self.connection() as conn:
            v = await conn.fetchval(self.sql.progress, log_name, source_location)
        return 0 if v is None else int(v)

    async def all_progress(self, log_name: str) -> dict[str, int]:
        async with self.connection() as conn:
            rows = await conn.fetch(self.sql.all_progress, log_name)
        return {r["source_location"]: int(r["source_log_seq_nr"]) for r in rows}

    async def write_replicated(
        self, log_name: str, source_location: str, events: Sequence[ReplicatedEvent], last_scanned: int
    ) -> WriteOutcome:
        """Write a batch from ``source_location`` in its order and store the progress, in one
        transaction, dropping every event this location already stored.

        An event is dropped by its exact identity (origin location, origin seq nr), never
        because the log's version vector covers it: a filter on one path can keep an event from
        this location while a later event of the same origin arrives, and the event must still be
        stored when it comes by another path. The version vector merges only stored events. The
        stored events go in with one statement (:mod:`.replicated_insert`).

        A local write to one of the batch's pids that commits first takes the sequence number
        the batch computed; the batch is then written again at once (a few times at most, then
        :class:`~journal.errors.SequenceConflict`: the endpoint retries after ``retry_delay``)."""
        return await racing_local_writes(
            log_name, events, lambda b: self._write_replicated(log_name, source_location, b, events, last_scanned)
        )

    async def _write_replicated(
        self, log_name: str, source_location: str, batch: WriteBatch, events: Sequence[ReplicatedEvent],
        last_scanned: int,
    ) -> WriteOutcome:  # fmt: skip
        async with self.connection() as conn, conn.transaction():
            # this transaction's rows pass the recovery guard and the timestamp rule trigger (if any)
            await conn.execute(f"{recovery_guard.MARK_REPLICATED_SQL}; {MARK_WRITER_LOCAL_SQL}")
            head = await log_head(conn, self.sql.lock_log, log_name)
            pos, vv = int(head["log_seq_nr"]), vector_time_of(head["version_vector"])
            while not head["recovering"]:
                # local events committed before this batch are stamped first: their vector times
                # never cover what arrives now, which their writers cannot have seen
                n, pos, vv = await self._stamp_locked(conn, log_name, pos, vv, STAMP_LIMIT)
                if n < STAMP_LIMIT:
                    break
            new = await self._not_stored(conn, log_name, events)
            if new:
                stored = [events[i] for i in new]
                positions = list(range(pos + 1, pos + 1 + len(stored)))
                await self.insert(conn, log_name, batch.select(new), stored, positions)
                pos, vv = positions[-1], merged(vv, stored)
                await conn.execute(self.sql.save_log, log_name, pos, dump_vt(vv))
            await conn.execute(self.sql.save_progress, log_name, source_location, last_scanned)
        return WriteOutcome(written=len(new), dropped=len(events) - len(new), progress=last_scanned)

    async def _not_stored(self, conn: Any, log_name: str, events: Sequence[ReplicatedEvent]) -> list[int]:
        """The positions of the events not stored here yet, each once (a batch never repeats
        one; be safe)."""
        if not events:
            return []
        return not_in(events, await stored_ids(conn, self.sql, log_name, [e.event_id for e in events]))

    async def insert(
        self, conn: Any, log_name: str, batch: WriteBatch, events: Sequence[ReplicatedEvent], positions: Sequence[int]
    ) -> None:
        """The events (``batch``, checked, and the events it was made of) at these log
        positions, in one statement."""
        b = self.backend
        tagged = any(batch.tags)
        metas = batch.metadata
        params: list[Any] = [
            batch.persistence_ids, batch.slices, batch.ser_ids, batch.manifests, batch.payloads,
            [orjson.dumps(list(t)).decode() if t else None for t in batch.tags],
            [m.ser_id if m else None for m in metas], [m.manifest if m else None for m in metas],
            [m.payload if m else None for m in metas],
            [e.origin_location for e in events], [e.origin_seq_nr for e in events],
            [dump_vt(e.vector_time) for e in events], positions, log_name, b.writer_id, b.conns.epoch,
        ]  # fmt: skip
        notify = b.settings.write.notify
        if notify:
            params.append(sorted(notify_groups(set(batch.slices), repeat(log_name))))
        if tagged:
            params.append(bucket_millis(b.settings.tags.bucket_size))
        await conn.fetchrow(self.sql.insert(notify=notify, tagged=tagged), *params)

    async def begin_recovery(self, log_names: Sequence[str]) -> None:
        """Flag the logs as recovering and install the recovery guard: from its commit on, every
        local write to them, by any process or writer, is refused (:mod:`.recovery_guard`)."""
        async with self.connection() as conn, conn.transaction():
            for name in log_names:
                await conn.execute(self.sql.set_recovering, name, True)
            await conn.execute(recovery_guard.install_sql(self.backend.settings.schema))

    async def end_recovery(self, log_names: Sequence[str]) -> None:
        """Clear the logs' recovering flags; drop the guard when no log is recovering any more."""
        async with self.connection() as conn, conn.transaction():
            for name in log_names:
                await conn.execute(self.sql.set_recovering, name, False)
            if not await conn.fetchval(self.sql.any_recovering):
                await conn.execute(recovery_guard.remove_sql(self.backend.settings.schema))

    async def recovering(self, log_names: Sequence[str]) -> bool:
        """Is one of these logs flagged as recovering (a recovery began and has not completed)?"""
        async with self.connection() as conn:
            return bool(await conn.fetchval(self.sql.recovering, list(log_names)))

    async def guard_installed(self) -> bool:
        schema = self.backend.settings.schema
        async with self.connection() as conn:
            found = await conn.fetchval(
                recovery_guard.INSTALLED_SQL, f'"{schema}".event_journal', recovery_guard.TRIGGER
            )
        return bool(found)

    async def record_target_progress(self, log_name: str, target_location: str, log_seq_nr: int) -> None:
        """A target read after ``log_seq_nr``: it has stored everything of this log up to there."""
        async with self.connection() as conn:
            await conn.execute(self.sql.save_target_progress, log_name, target_location, log_seq_nr)

    async def target_progress(self, log_name: str) -> dict[str, int]:
        async with self.connection() as conn:
            rows = await conn.fetch(self.sql.target_progress, log_name)
        return {r["target_location"]: int(r["log_seq_nr"]) for r in rows}

    async def reserve_positions(self, log_name: str, at_least: int) -> None:
        """Make the log's next position greater than ``at_least`` (disaster recovery: peers may
        have read this location's old log that far)."""
        async with self.connection() as conn:
            await conn.execute(self.sql.reserve, log_name, at_least)

    async def delete_logically(self, log_name: str, to_log_seq_nr: int) -> int:
        """Mark the log's events up to ``to_log_seq_nr`` deleted: local reads (slice queries,
        entities) skip them, replication still sends them. Returns the position actually applied
        (no further than the log's current position)."""
        async with self.connection() as conn, conn.transaction():
            head = await log_head(conn, self.sql.lock_log, log_name)
            applied = min(to_log_seq_nr, int(head["log_seq_nr"]))
            await conn.execute(self.sql.delete_logically, log_name, applied)
        return applied

    async def delete_physically(self, log_name: str, to_log_seq_nr: int, replicated_to: Sequence[str]) -> int:
        """Remove logically deleted events up to ``to_log_seq_nr`` that every location in
        ``replicated_to`` has stored (each pid's highest event stays as its tombstone). Returns
        the position it could go to: less than asked while a named target is behind."""
        progress = await self.target_progress(log_name)
        bound = min([to_log_seq_nr, *(progress.get(t, 0) for t in replicated_to)])
        if bound > 0:
            async with self.connection() as conn:
                await conn.execute(self.sql.delete_physically, log_name, bound)
        return max(bound, 0)

    async def delete_invalid_snapshots(self, log_name: str) -> int:
        """Delete snapshots of the log's entities that cover events this location no longer has."""
        async with self.connection() as conn:
            status = await conn.execute(self.sql.delete_invalid_snapshots, log_name)
        return int(status.split()[-1])

    async def entity_events(self, persistence_id: str) -> list[tuple[Serialized, str, int, VectorTime]]:
        """A pid's stamped events in local order: payload, origin location and seq nr, vector time."""
        async with self.connection() as conn:
            rows = await conn.fetch(self.sql.entity_events, persistence_id)
        return [
            (
                Serialized(r[0], r[1], bytes(r[2])),
                r["origin_location"],
                int(r["origin_seq_nr"]),
                vector_time_of(r["vector_time"]),
            )
            for r in rows
        ]

    async def event_ids(self, log_name: str) -> dict[tuple[str, int], int]:
        """Every event id of the log with how many times it is stored (for checks and status)."""
        async with self.connection() as conn:
            rows = await conn.fetch(self.sql.event_ids, log_name)
        return {(r["origin_location"], int(r["origin_seq_nr"])): int(r["n"]) for r in rows}


async def racing_local_writes(
    log_name: str, events: Sequence[ReplicatedEvent], write: Callable[[WriteBatch], Awaitable[WriteOutcome]]
) -> WriteOutcome:
    """``write(batch)`` of the events checked as a batch (the write path's one validator), again
    while a local write took a sequence number the batch computed (a few times, then
    :class:`~journal.errors.SequenceConflict`: the endpoint retries later)."""
    batch = replicated_batch(log_name, events)
    for attempt in range(SEQUENCE_RACE_ATTEMPTS):
        try:
            return await write(batch)
        except asyncpg.UniqueViolationError as e:
            if e.constraint_name != PRIMARY_KEY or attempt + 1 == SEQUENCE_RACE_ATTEMPTS:
                raise SequenceConflict(
                    events[0].persistence_id if events else "", None,
                    f"a replicated batch of {log_name!r} kept racing local writes: {e}",
                ) from e  # fmt: skip
    raise AssertionError("unreachable")


async def stored_ids(
    conn: Any, sql: ReplicationStatements, log_name: str, ids: Sequence[tuple[str, int]]
) -> set[tuple[str, int]]:
    """Those of ``ids`` (origin location, origin seq nr) stored in this database's log."""
    rows = await conn.fetch(sql.stored_ids, log_name, [i[0] for i in ids], [i[1] for i in ids])
    return {(r["origin"], int(r["origin_seq"])) for r in rows}


def stamp_columns(location: str, rows: Sequence[tuple[str, int, int, VectorTime]]) -> list[list[Any]]:
    """The parameters of :attr:`ReplicationStatements.stamp` for local events (pid, seq nr,
    position, vector time) stamped as ``location``'s."""
    cols: list[list[Any]] = [[], [], [], [], [], []]
    for pid, seq_nr, pos, vt in rows:
        for col, v in zip(cols, (pid, seq_nr, location, pos, dump_vt(vt), pos), strict=True):
            col.append(v)
    return cols


def not_in(events: Sequence[ReplicatedEvent], stored: set[tuple[str, int]]) -> list[int]:
    """The positions in ``events`` of those not in ``stored``, each identity once (a batch never
    repeats one; be safe)."""
    seen = set(stored)
    out = []
    for i, e in enumerate(events):
        if e.event_id not in seen:
            seen.add(e.event_id)
            out.append(i)
    return out


def merged(vv: VectorTime, events: Sequence[ReplicatedEvent]) -> VectorTime:
    """The version vector with the vector times of ``events`` folded in."""
    highest: dict[str, int] = {}
    for e in events:
        for location, counter in e.vector_time.items():
            if counter > highest.get(location, 0):
                highest[location] = counter
    return vv.merge(highest)


def events_of(rows: Sequence[asyncpg.Record]) -> list[ReplicatedEvent]:
    out: list[ReplicatedEvent] = []
    for r in rows:
        if r["deleted"] and not r["event_payload"]:
            continue  # a tombstone of the journal's own delete_events_to: nothing to send
        meta = None
        if r["meta_ser_id"] is not None:
            meta = Serialized(r["meta_ser_id"], r["meta_ser_manifest"] or "", bytes(r["meta_payload"] or b""))
        out.append(
            ReplicatedEvent(
                persistence_id=r["persistence_id"],
                event=Serialized(r["event_ser_id"], r["event_ser_manifest"], bytes(r["event_payload"])),
                origin_location=r["origin_location"],
                origin_seq_nr=r["origin_seq_nr"],
                vector_time=vector_time_of(r["vector_time"]),
                log_seq_nr=r["log_seq_nr"],
                tags=tuple(r["tags"] or ()),
                metadata=meta,
            )
        )
    return out
