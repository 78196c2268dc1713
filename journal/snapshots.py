"""The snapshot value returned by :meth:`Journal.load_snapshot`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A pid's latest snapshot: the state as of ``seq_nr`` (one snapshot per pid is kept)."""

    persistence_id: str
    seq_nr: int
    state: Any
    write_timestamp: datetime
    tags: tuple[str, ...] = ()
    metadata: Any = None
