"""The event envelope every query delivers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .offsets import Offset


@dataclass(frozen=True, slots=True)
class EventEnvelope:
    """One stored event with everything a consumer needs.

    ``event`` is the deserialized payload. Envelopes found only by a payload-free query
    (backtracking) carry ``event=None`` and ``has_payload=False`` until loaded.
    """

    persistence_id: str
    entity_type: str
    slice: int
    seq_nr: int
    db_timestamp: datetime
    event: Any
    offset: Offset
    tags: tuple[str, ...] = ()
    metadata: Any = None
    writer: str = ""
    has_payload: bool = True
    source: str = "query"
