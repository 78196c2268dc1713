"""slice-journal projections: offset store, validation, handler kinds, slice leases, workers."""

from .handlers import MODES, Mode, load_handler
from .management import ProjectionStatus, RangeStatus
from .postgres_store import ProjectionSql
from .runner import RangeProcessor
from .stats import Stats
from .validation import Check, SliceState, Validator, Verdict
from .worker import Worker, chunk

__all__ = [
    "MODES",
    "Check",
    "Mode",
    "ProjectionSql",
    "ProjectionStatus",
    "RangeProcessor",
    "RangeStatus",
    "SliceState",
    "Stats",
    "Validator",
    "Verdict",
    "Worker",
    "chunk",
    "load_handler",
]
