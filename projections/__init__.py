"""slice-journal projections: workers that apply a journal's events to read models.

The public API is what ``__all__`` lists: the workers (by slice range, by tag), the handler
kinds, the status types, and the projection errors. Everything else is internal.
"""

from journal.errors import HandlerFailed, LeaseLost, ProjectionBusy, ProjectionError

from .dead_letter_store import DeadLetter
from .handlers import MODES, Mode, load_handler
from .management import ProjectionStatus, RangeStatus
from .recovery import HandlerRecovery
from .state_runner import StateWorker
from .stats import Stats
from .tag_runner import TagWorker
from .versions import ProjectionVersion, drop_version, list_versions, switch_version
from .worker import Worker
from .write_waits import WriteWaits, wait_processed

__all__ = [
    "MODES",
    "DeadLetter",
    "HandlerFailed",
    "HandlerRecovery",
    "LeaseLost",
    "Mode",
    "ProjectionBusy",
    "ProjectionError",
    "ProjectionStatus",
    "ProjectionVersion",
    "RangeStatus",
    "StateWorker",
    "Stats",
    "TagWorker",
    "Worker",
    "WriteWaits",
    "drop_version",
    "list_versions",
    "load_handler",
    "switch_version",
    "wait_processed",
]
