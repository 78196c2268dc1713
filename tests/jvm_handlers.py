"""Projection handlers the interop tests run in worker processes (``--handler jvm_handlers:record``)."""

from __future__ import annotations

import json
from typing import Any

from journal.envelope import EventEnvelope


async def record(conn: Any, envelope: EventEnvelope) -> None:
    """Exactly-once: one row per event, in the offset transaction; a second delivery violates the key."""
    await conn.execute(
        "INSERT INTO py_projection_seen (persistence_id, seq_nr, payload) VALUES ($1, $2, $3::jsonb)",
        envelope.persistence_id,
        envelope.seq_nr,
        None if envelope.event is None else json.dumps(envelope.event),
    )
