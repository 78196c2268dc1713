"""The statements of replicated logs (issue 14), built once per schema, and the small helpers
that read and write their columns; :mod:`.replication_store` runs them where its executor says."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import asyncpg
import orjson

from ..errors import ReplicationError
from ..ids import validate_entity_type
from ..settings import validate_identifier
from ..vector_time import VectorTime
from .recovery_guard import REPLICATING_SETTING
from .replicated_insert import insert_replicated
from .timestamp_rule import WRITER_SETTING, WRITER_VALUE


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
        self.lock_log_replicated = (  # and mark the transaction: its rows are replicated (no extra round trip)
            f"SELECT location, log_seq_nr, version_vector, recovering, "
            f"set_config('{REPLICATING_SETTING}', 'on', true) AS guard, "
            f"set_config('{WRITER_SETTING}', '{WRITER_VALUE}', true) AS rule "
            f"FROM {rl} WHERE log_name = $1 FOR UPDATE"
        )
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
        self.plan_stamps_per_call = "SET LOCAL plan_cache_mode = force_custom_plan"
        """Run before a stamp, in its transaction: the stamp joins its rows to the table by the
        key, and a generic plan cached while the table was nearly empty (a hash join over a
        sequential scan) stays until the next ANALYZE and reads the whole table on every stamp
        (0.12 ms for one row at an empty log, 6.3 ms at 30,000 events); planned per call, it
        uses the key (0.08-0.09 ms)."""
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
        self.target_state = (
            f"SELECT l.version_vector, (SELECT p.source_log_seq_nr FROM {rp} p WHERE p.log_name = $1 "
            f"AND p.source_location = $2) AS progress FROM {rl} l WHERE l.log_name = $1"
        )
        self.all_progress = f"SELECT source_location, source_log_seq_nr FROM {rp} WHERE log_name = $1"
        self.save_progress = (
            f"INSERT INTO {rp} (log_name, source_location, source_log_seq_nr, updated_at) "
            f"VALUES ($1, $2, $3, now()) ON CONFLICT (log_name, source_location) DO UPDATE "
            f"SET source_log_seq_nr = GREATEST({rp}.source_log_seq_nr, EXCLUDED.source_log_seq_nr), updated_at = now()"
        )
        self.save_log_and_progress = (  # a replicated batch's end: one statement, one round trip
            f"WITH p AS ({self.save_progress.replace('$3', '$5').replace('$2', '$4')}) "
            f"UPDATE {rl} SET log_seq_nr = $2, version_vector = $3 WHERE log_name = $1"
        )
        self.entity_events = (
            f"SELECT event_ser_id, event_ser_manifest, event_payload, origin_location, origin_seq_nr, vector_time "
            f"FROM {ej} WHERE persistence_id = $1 AND log_seq_nr IS NOT NULL AND NOT deleted ORDER BY seq_nr"
        )
        self.save_target_progress = (  # committed without waiting for the WAL flush: a crash can
            # only lose a step forward, and a lower figure only defers physical deletion further
            f"WITH quick AS (SELECT set_config('synchronous_commit', 'off', true)) "
            f"INSERT INTO {rt} (log_name, target_location, log_seq_nr, updated_at) "
            f"SELECT $1::text, $2::text, $3::bigint, now() FROM quick "
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
        """The log's local events not stamped yet, in commit-visible order, with each one's slice
        and timestamp. The log name is a literal (quoted here), so even a generic plan matches
        the log's partial index."""
        return (
            f"SELECT persistence_id, seq_nr, slice, db_timestamp FROM {self.ej} "
            f"WHERE entity_type = {_literal(log_name)} AND log_seq_nr IS NULL "
            f"ORDER BY db_timestamp, seq_nr, persistence_id LIMIT $1"
        )

    def unstamped_within(self, log_name: str) -> str:
        """:meth:`unstamped` of the slices ``$2`` only."""
        return (
            f"SELECT persistence_id, seq_nr, slice, db_timestamp FROM {self.ej} "
            f"WHERE entity_type = {_literal(log_name)} AND log_seq_nr IS NULL AND slice = ANY($2::int[]) "
            f"ORDER BY db_timestamp, seq_nr, persistence_id LIMIT $1"
        )

    def any_unstamped(self, log_name: str) -> str:
        """Has the log a local event not stamped yet (of the slices ``$1``, or any with NULL)?
        A first row in the unstamped index's order, not ``EXISTS``: the planner drops an
        ORDER BY inside ``EXISTS`` and, where the statistics still say most rows are unstamped
        (analyzed before a first stamp, a log newly replicated), expects a sequential scan to
        stop at once, and then scans the whole table on every read (6.8 ms per call at 50,000
        events); with the order the partial index is the only cheap plan."""
        return (
            f"SELECT (SELECT true FROM {self.ej} WHERE entity_type = {_literal(log_name)} "
            f"AND log_seq_nr IS NULL AND ($1::int[] IS NULL OR slice = ANY($1::int[])) "
            f"ORDER BY db_timestamp, seq_nr, persistence_id LIMIT 1) IS NOT NULL"
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
    d = orjson.loads(value) if isinstance(value, str | bytes) else value
    return VectorTime.of_clean(d) if type(d) is dict else VectorTime.from_json(d)


async def log_head(conn: Any, sql: str, log_name: str) -> asyncpg.Record:
    row: asyncpg.Record | None = await conn.fetchrow(sql, log_name)
    if row is None:
        raise ReplicationError(f"log {log_name!r} is not set up at this location (ensure_log first)")
    return row


def dump_vt(vt: VectorTime) -> str:
    return orjson.dumps(vt.to_json()).decode()


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


@functools.cache
def statements_for(schema: str) -> ReplicationStatements:
    """The statements of ``schema`` (built once: every part of a partitioned location asks)."""
    return ReplicationStatements(schema)
