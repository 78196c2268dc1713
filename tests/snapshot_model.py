"""Handlers of the starting-from-snapshots projection tests (imported by worker processes by path).

The read model is a pid's running sum of its events' ``n`` and the last seq_nr it applied, in
``m_full_<entity type>`` (the projection that reads every event) or ``m_snap_<entity type>`` (the
one that starts from snapshots, whose snapshot hook sets the sum). An event that does not follow
the pid's last applied seq_nr fails the handler: a skipped or repeated event is never silent.
The tables are the test's to create (:func:`create`). ``SNAPSHOT_MODEL_PAUSE`` (seconds) slows
each batch, so a test's kill lands mid catch-up.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

import asyncpg

from journal import EventEnvelope


def table(kind: str, entity_type: str) -> str:
    return f"m_{kind}_{entity_type.lower()}"


async def create(conn: asyncpg.Connection, entity_type: str) -> None:
    for kind in ("full", "snap"):
        t = table(kind, entity_type)
        await conn.execute(f"DROP TABLE IF EXISTS {t}")
        await conn.execute(f"CREATE TABLE {t} (pid text PRIMARY KEY, total bigint, last_seq bigint)")


async def _apply(conn: asyncpg.Connection, t: str, envelopes: Sequence[EventEnvelope], first_any: bool) -> None:
    """``first_any``: a pid's first event may have any seq_nr (a full read of a pid whose
    first events were deleted); else it must be 1 (from snapshots, a snapshot comes first)."""
    for e in envelopes:
        last = await conn.fetchval(f"SELECT last_seq FROM {t} WHERE pid = $1", e.persistence_id)
        if (last is not None or not first_any) and (last or 0) + 1 != e.seq_nr:
            raise RuntimeError(f"{e.persistence_id}: event {e.seq_nr} after {last}")
        await conn.execute(
            f"INSERT INTO {t} VALUES ($1, $2, $3) ON CONFLICT (pid) "
            f"DO UPDATE SET total = {t}.total + $2, last_seq = $3",
            e.persistence_id, e.event["n"], e.seq_nr,
        )  # fmt: skip
    await asyncio.sleep(float(os.environ.get("SNAPSHOT_MODEL_PAUSE", "0")))


async def full(conn: asyncpg.Connection, envelopes: Sequence[EventEnvelope]) -> None:
    """Every event (a plain projection)."""
    await _apply(conn, table("full", envelopes[0].entity_type), envelopes, first_any=True)


async def from_snapshots(conn: asyncpg.Connection, envelopes: Sequence[EventEnvelope]) -> None:
    """The events after the snapshots (the projection started from snapshots)."""
    await _apply(conn, table("snap", envelopes[0].entity_type), envelopes, first_any=False)


async def restore(conn: asyncpg.Connection, snapshots: Sequence[EventEnvelope]) -> None:
    """The snapshot hook: the pid's state is the snapshot's."""
    t = table("snap", snapshots[0].entity_type)
    await conn.executemany(
        f"INSERT INTO {t} VALUES ($1, $2, $3) ON CONFLICT (pid) DO UPDATE SET total = $2, last_seq = $3",
        [(s.persistence_id, s.event["sum"], s.seq_nr) for s in snapshots],
    )
