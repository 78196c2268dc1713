"""What :meth:`Entity.on_snapshot_saved` receives when a snapshot save ends."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SnapshotResult:
    """The outcome of one snapshot save: the state as of ``seq_nr``, stored unless ``error``."""

    persistence_id: str
    seq_nr: int
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.error is None
