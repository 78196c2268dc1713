"""Handlers of the sequenced dead-letter tests (loaded by worker processes as
``tests.sequenced_handler:...``).

Each records the events it applies in ``seq_applied`` under a primary key (an event applied
twice fails) with an identity column in the order they were applied: per persistence id, the
read model must see seq_nrs 1, 2, 3... in that order. The first ones fail on every event whose
payload says ``{"poison": true}``; the ``*_fixed`` ones are the same handlers after the fix.
``SJ_TEST_DRAIN_PAUSE`` (seconds): the fixed handlers take that long per event, so that a
drain can be stopped half-way (set for the ``dead-letters retry`` process only).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

from journal.envelope import EventEnvelope

CREATE = """CREATE TABLE IF NOT EXISTS seq_applied (
  n bigint GENERATED ALWAYS AS IDENTITY, pid text, seq bigint, PRIMARY KEY (pid, seq))"""


class Poisoned(Exception):
    """The handler's bug: it cannot handle this event."""


def _check(envs: Sequence[EventEnvelope]) -> None:
    for e in envs:
        if isinstance(e.event, dict) and e.event.get("poison"):
            raise Poisoned(f"cannot handle {e.persistence_id} #{e.seq_nr}")


async def record(conn: Any, envs: Sequence[EventEnvelope]) -> None:
    await conn.executemany(
        "INSERT INTO seq_applied (pid, seq) VALUES ($1, $2)", [(e.persistence_id, e.seq_nr) for e in envs]
    )


async def project(conn: Any, envs: Sequence[EventEnvelope]) -> None:
    _check(envs)
    await record(conn, envs)


async def project_fixed(conn: Any, envs: Sequence[EventEnvelope]) -> None:
    pause = float(os.environ.get("SJ_TEST_DRAIN_PAUSE", "0"))
    if pause:
        await asyncio.sleep(pause * len(envs))  # slows the drain down so that a test can stop it half-way
    await record(conn, envs)


async def project_one(conn: Any, env: EventEnvelope) -> None:
    await project(conn, [env])


async def project_one_fixed(conn: Any, env: EventEnvelope) -> None:
    await project_fixed(conn, [env])
