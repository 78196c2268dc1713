"""Projection handlers for the metrics test (events, states): fail while the gate is closed, then project."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from journal import EventEnvelope, StateChange

SETUP = """
CREATE TABLE IF NOT EXISTS metrics_gate (open boolean NOT NULL);
CREATE TABLE IF NOT EXISTS metrics_projected (persistence_id text NOT NULL, seq_nr bigint NOT NULL,
  PRIMARY KEY (persistence_id, seq_nr));
TRUNCATE metrics_gate, metrics_projected;
INSERT INTO metrics_gate VALUES (false);
"""


async def project(conn: asyncpg.Connection, envelopes: Sequence[EventEnvelope]) -> None:
    """Grouped handler: raises (the batch is rolled back and retried) until the gate is open."""
    if not await conn.fetchval("SELECT open FROM metrics_gate"):
        raise RuntimeError("gate closed")
    await conn.executemany(
        "INSERT INTO metrics_projected VALUES ($1, $2)", [(e.persistence_id, e.seq_nr) for e in envelopes]
    )


async def project_states(conn: asyncpg.Connection, changes: Sequence[StateChange]) -> None:
    """The grouped state handler: the same gate; each change recorded as (pid, revision)."""
    if not await conn.fetchval("SELECT open FROM metrics_gate"):
        raise RuntimeError("gate closed")
    await conn.executemany(
        "INSERT INTO metrics_projected VALUES ($1, $2)", [(c.persistence_id, c.revision) for c in changes]
    )
