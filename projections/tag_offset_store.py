"""SQL of the offsets of projections over a tag (``projection_tag_offset_store``).

One row per (projection, tag, pid): its latest processed seq_nr and that event's TimeUUID offset.
Rows are written in the handler's transaction (exactly-once and grouped kinds), so the stored
offsets and the handler's effects commit together.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from journal.postgres import SchemaSql


@dataclass(frozen=True)
class TagOffsets:
    """What is stored for one projection over one tag."""

    latest: uuid.UUID | None
    """The greatest processed offset (in tag-view order): the query resumes after it."""
    seq_nrs: dict[str, int]
    """pid -> latest processed seq_nr (drops events delivered again)."""


@dataclass(frozen=True)
class TagOffsetSql(SchemaSql):
    @property
    def table(self) -> str:
        return self.t("projection_tag_offset_store")

    async def load(self, conn: Any, name: str, tag: str) -> TagOffsets:
        rows = await conn.fetch(
            f"SELECT persistence_id, seq_nr, tag_offset FROM {self.table} WHERE projection_name = $1 AND tag = $2 "
            "ORDER BY offset_time DESC, tag_offset DESC",
            name,
            tag,
        )
        latest: uuid.UUID | None = rows[0]["tag_offset"] if rows else None
        return TagOffsets(latest, {r["persistence_id"]: r["seq_nr"] for r in rows})

    async def stored_seq_nr(self, conn: Any, name: str, tag: str, pid: str) -> int | None:
        """One pid's stored seq_nr (did a transaction whose COMMIT got no answer commit?)."""
        value = await conn.fetchval(
            f"SELECT seq_nr FROM {self.table} WHERE projection_name = $1 AND tag = $2 AND persistence_id = $3",
            name,
            tag,
            pid,
        )
        return None if value is None else int(value)

    async def save(self, conn: Any, name: str, tag: str, rows: dict[str, tuple[int, uuid.UUID]]) -> None:
        """Upsert pid -> (seq_nr, offset); a row never moves back to a lower seq_nr."""
        if not rows:
            return
        pids = list(rows)
        await conn.execute(
            f"""INSERT INTO {self.table}
  (projection_name, tag, persistence_id, seq_nr, tag_offset, offset_time, timestamp_consumed)
SELECT $1, $2, u.p, u.n, u.o, u.t, clock_timestamp()
FROM unnest($3::text[], $4::bigint[], $5::uuid[], $6::bigint[]) AS u(p, n, o, t)
ON CONFLICT (projection_name, tag, persistence_id) DO UPDATE
SET seq_nr = EXCLUDED.seq_nr, tag_offset = EXCLUDED.tag_offset, offset_time = EXCLUDED.offset_time,
  timestamp_consumed = EXCLUDED.timestamp_consumed
WHERE {self.table}.seq_nr < EXCLUDED.seq_nr""",
            name,
            tag,
            pids,
            [rows[p][0] for p in pids],
            [rows[p][1] for p in pids],
            [rows[p][1].time for p in pids],
        )

    async def delete(self, conn: Any, name: str, tag: str) -> int:
        status: str = await conn.execute(f"DELETE FROM {self.table} WHERE projection_name = $1 AND tag = $2", name, tag)
        return int(status.split()[-1])
