"""The cleanup tool's deletions on PostgreSQL (:class:`journal.backend.CleanupStore`).

Tag rows are found through the ``(tag_name, persistence_id, ...)`` index: the tag names are
listed with a loose index scan (one probe per distinct tag), then the pid's rows of each tag are
deleted, so rows whose events were deleted earlier are found too, without a table scan.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg

from ..backend import PidFootprint
from ..ids import slice_for
from .connections import PostgresConnections
from .schema_sql import SchemaSql, Sql

DELETE_BATCH_SIZE = 10_000
"""Event rows deleted per statement (each batch commits: an interrupted run keeps its progress)."""

_ALL = 2**63 - 1


@dataclass(frozen=True)
class CleanupStatements(SchemaSql):
    event_count = Sql(
        "SELECT count(*) FILTER (WHERE NOT deleted), COALESCE(max(seq_nr), 0), min(seq_nr) FILTER (WHERE NOT deleted) "
        "FROM {event_journal} WHERE persistence_id = $1"
    )

    snapshot_seq_nr = Sql("SELECT seq_nr FROM {snapshot} WHERE persistence_id = $1")

    @property
    def tag_names(self) -> str:
        """Every distinct tag of the tag view, by a loose index scan (a probe per tag)."""
        tv = self.t("tag_views")
        return f"""
WITH RECURSIVE t AS (
  (SELECT tag_name FROM {tv} ORDER BY tag_name LIMIT 1)
  UNION ALL
  SELECT (SELECT v.tag_name FROM {tv} v WHERE v.tag_name > t.tag_name ORDER BY v.tag_name LIMIT 1)
  FROM t WHERE t.tag_name IS NOT NULL
) SELECT tag_name FROM t WHERE tag_name IS NOT NULL"""

    tag_row_count = Sql("SELECT count(*) FROM {tag_views} WHERE tag_name = ANY($2::text[]) AND persistence_id = $1")

    delete_tag_rows = Sql("DELETE FROM {tag_views} WHERE tag_name = ANY($2::text[]) AND persistence_id = $1")

    @property
    def raise_tag_progress(self) -> str:
        """The pid's progress per tag raised to its highest tag row (never lowered)."""
        pr = self.t("tag_write_progress")
        return f"""
INSERT INTO {pr} AS pr (persistence_id, tag, sequence_nr, tag_pid_sequence_nr, "offset")
SELECT DISTINCT ON (tag_name) persistence_id, tag_name, sequence_nr, tag_pid_sequence_nr, timestamp
FROM {self.t("tag_views")} WHERE tag_name = ANY($2::text[]) AND persistence_id = $1
ORDER BY tag_name, tag_pid_sequence_nr DESC
ON CONFLICT (persistence_id, tag) DO UPDATE SET
  sequence_nr = GREATEST(pr.sequence_nr, EXCLUDED.sequence_nr),
  "offset" = CASE WHEN EXCLUDED.tag_pid_sequence_nr > pr.tag_pid_sequence_nr
    THEN EXCLUDED."offset" ELSE pr."offset" END,
  tag_pid_sequence_nr = GREATEST(pr.tag_pid_sequence_nr, EXCLUDED.tag_pid_sequence_nr)"""


class PostgresCleanup:
    """``delete_events_to``: the backend's own (the highest row kept as the tombstone)."""

    def __init__(self, conns: PostgresConnections, delete_events_to: Callable[[str, int], Awaitable[None]]) -> None:
        self.conns = conns
        self.sql = CleanupStatements(conns.settings.schema)
        self._run = conns.run
        self._delete_events_to = delete_events_to

    async def footprint(self, persistence_id: str) -> PidFootprint:
        async def op(conn: asyncpg.Connection) -> PidFootprint:
            counted = await conn.fetchrow(self.sql.event_count, persistence_id)
            assert counted is not None  # an aggregate always returns a row
            events, highest, lowest = counted
            snap = await conn.fetchval(self.sql.snapshot_seq_nr, persistence_id)
            tags = [r[0] for r in await conn.fetch(self.sql.tag_names)]
            tag_rows = await conn.fetchval(self.sql.tag_row_count, persistence_id, tags) if tags else 0
            return PidFootprint(persistence_id, int(events), int(highest), snap, int(tag_rows), lowest)

        result: PidFootprint = await self._run("cleanup footprint", op)
        return result

    async def delete_tag_rows(self, persistence_id: str, *, keep_numbering: bool) -> None:
        """One transaction: the progress raised (journal writes continue after it, see
        ``TagStatements.insert_from_events``) and the rows deleted, or all of it deleted."""

        async def op(conn: asyncpg.Connection) -> None:
            async with conn.transaction():
                await conn.execute(self.conns.sql.delete_check, self.conns.epoch, [slice_for(persistence_id)])
                tags = [r[0] for r in await conn.fetch(self.sql.tag_names)]
                if tags and keep_numbering:
                    await conn.execute(self.sql.raise_tag_progress, persistence_id, tags)
                if tags:
                    await conn.execute(self.sql.delete_tag_rows, persistence_id, tags)
                if not keep_numbering:
                    await conn.execute(self.sql.delete_pid("tag_write_progress"), persistence_id)
                    await conn.execute(self.sql.delete_pid("tag_scanning"), persistence_id)

        await self._run("cleanup tag rows", op)

    async def delete_all_events(self, persistence_id: str, *, reset_seq_nr: bool) -> None:
        if not reset_seq_nr:
            # the highest row stays as the reference's tombstone: the next write continues after it
            await self._delete_events_to(persistence_id, _ALL)
            return

        async def batch(conn: asyncpg.Connection) -> str:
            async with conn.transaction():
                await conn.execute(self.conns.sql.delete_check, self.conns.epoch, [slice_for(persistence_id)])
                status: str = await conn.execute(self.conns.sql.delete_batch, persistence_id, _ALL, DELETE_BATCH_SIZE)
                return status

        while True:
            status = await self._run("cleanup events", batch)
            if int(status.split()[-1]) < DELETE_BATCH_SIZE:
                return
