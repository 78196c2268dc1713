"""Handlers of the dead-letter tests (loaded by worker processes as ``tests.poison_handler:...``).

``project`` fails on every event whose payload says ``{"poison": true}``; ``project_fixed`` is
the same handler after the fix. Both insert under a primary key, so an event applied twice fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from journal.envelope import EventEnvelope

CREATE = "CREATE TABLE IF NOT EXISTS poison_projected (pid TEXT, seq BIGINT, PRIMARY KEY (pid, seq))"


class Poisoned(Exception):
    """The handler's bug: it cannot handle this event."""


async def project(conn: Any, envs: Sequence[EventEnvelope]) -> None:
    for e in envs:
        if isinstance(e.event, dict) and e.event.get("poison"):
            raise Poisoned(f"cannot handle {e.persistence_id} #{e.seq_nr}")
    await project_fixed(conn, envs)


async def project_fixed(conn: Any, envs: Sequence[EventEnvelope]) -> None:
    await conn.executemany("INSERT INTO poison_projected VALUES ($1, $2)", [(e.persistence_id, e.seq_nr) for e in envs])
