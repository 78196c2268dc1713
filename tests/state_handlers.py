"""Handlers of the state projection tests (run in worker processes by ``projections run --states``).

Each delivery is logged in ``state_log`` (in order, by its serial) and applied to ``state_view``:
exactly-once and grouped in the offset transaction, so a rolled-back batch leaves no log row and
a duplicate or a revision going backwards shows in the log.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from journal import DeletedState, StateChange, UpdatedState

TABLES = """
CREATE TABLE IF NOT EXISTS state_view (pid text PRIMARY KEY, revision bigint NOT NULL, value jsonb);
CREATE TABLE IF NOT EXISTS state_log (n bigserial PRIMARY KEY, pid text NOT NULL, revision bigint NOT NULL,
                                      deleted boolean NOT NULL);
TRUNCATE state_view, state_log;
"""


class Poisoned(Exception):
    pass


async def apply(conn: Any, change: StateChange, *, fixed: bool = False) -> None:
    match change:
        case UpdatedState(persistence_id=pid, revision=revision, value=value):
            if value.get("poison") and not fixed:
                raise Poisoned(f"cannot handle {pid} #{revision}")
            deleted, stored = False, value
        case DeletedState(persistence_id=pid, revision=revision):
            deleted, stored = True, None
    await conn.execute("INSERT INTO state_log (pid, revision, deleted) VALUES ($1, $2, $3)", pid, revision, deleted)
    await conn.execute(
        "INSERT INTO state_view VALUES ($1, $2, $3::jsonb) ON CONFLICT (pid) DO UPDATE SET revision = $2, value = $3",
        pid, revision, None if stored is None else json.dumps(stored),
    )  # fmt: skip


async def project(conn: Any, change: StateChange) -> None:
    """exactly-once"""
    await apply(conn, change)


async def project_group(conn: Any, changes: Sequence[StateChange]) -> None:
    """grouped"""
    for change in changes:
        await apply(conn, change)


async def project_fixed(conn: Any, changes: Sequence[StateChange]) -> None:
    """grouped, the poison handled (what a dead-letter retry runs)"""
    for change in changes:
        await apply(conn, change, fixed=True)
