"""Re-export: the replicated value types live below the backend seam (:mod:`journal.replicated`)."""

from ..replicated import ReplicatedEvent, ReplicationBatch, WriteOutcome

__all__ = ["ReplicatedEvent", "ReplicationBatch", "WriteOutcome"]
