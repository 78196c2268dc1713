"""The cleanup tool: delete what given persistence ids left in the journal (the reference's
cleanup), on PostgreSQL and Cassandra alike.

The entities of those pids must not be running. Each step is idempotent and a pid's steps run
in an order a re-run can finish (its tag rows, which Cassandra finds through its events, before
its events), so an interrupted cleanup reaches the same end state when it is simply run again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from .backend import Backend, CleanupStore, PidFootprint
from .errors import InvalidArgument, UnsupportedOperation
from .ids import validate_persistence_id


class CleanupAction(StrEnum):
    DELETE_ALL = "delete-all"
    """Events, tag rows and the snapshot of each pid (with ``reset_seq_nr``, its tag writer
    progress and the pid itself too)."""
    DELETE_SNAPSHOTS = "delete-snapshots"
    """Only the snapshot of each pid."""
    DELETE_BEFORE_SNAPSHOT = "delete-before-snapshot"
    """Events up to and including the snapshot's sequence number (tag rows stay, as in the
    reference: the tag view is its own copy)."""


@dataclass(frozen=True, slots=True)
class PidResult:
    """One pid's cleanup: what it held before, and after (in a dry run: what a real run would leave)."""

    persistence_id: str
    action: CleanupAction
    before: PidFootprint
    after: PidFootprint | None
    skipped: str | None = None
    """Why nothing was deleted (e.g. no snapshot), else None."""


def read_pids(path: Path) -> list[str]:
    """Persistence ids from a file: one per line; blank lines and ``#`` comments are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InvalidArgument(f"cannot read persistence ids from {str(path)!r}: {e.strerror or e}") from e
    except UnicodeDecodeError as e:
        raise InvalidArgument(
            f"{str(path)!r} is not a text file of persistence ids (not UTF-8 at byte {e.start})"
        ) from e
    return [s for line in text.splitlines() if (s := line.strip()) and not s.startswith("#")]


def validate_pids(pids: Iterable[str]) -> list[str]:
    """Every pid valid (else InvalidArgument before any I/O), duplicates dropped, order kept."""
    out = [validate_persistence_id(p) for p in pids]
    return list(dict.fromkeys(out))


class Cleanup:
    """Deletes by persistence id over a backend that offers :class:`~journal.backend.CleanupStore`.

    ``dry_run`` reads what each pid holds and deletes nothing. Use it with an open journal:
    ``Cleanup(journal.backend)``.
    """

    def __init__(self, backend: object, *, dry_run: bool = False) -> None:
        if not isinstance(backend, Backend):
            raise UnsupportedOperation(f"backend {type(backend).__name__} offers no cleanup operations")
        self.backend = backend
        self.store: CleanupStore = backend.cleanup_store()
        self.dry_run = dry_run

    async def run(
        self,
        action: CleanupAction,
        pids: Iterable[str],
        *,
        reset_seq_nr: bool = False,
        on_done: Callable[[PidResult], None] | None = None,
    ) -> list[PidResult]:
        """Apply ``action`` to each pid in turn; ``on_done`` is called after each one.

        ``reset_seq_nr`` (delete-all only): forget the pid entirely, so it may start again at
        sequence number 1; by default its highest sequence number is kept and a later write
        continues after it. Raises InvalidArgument for a bad pid before anything is deleted.
        """
        action = CleanupAction(action)
        if reset_seq_nr and action is not CleanupAction.DELETE_ALL:
            raise InvalidArgument("reset_seq_nr applies only to delete-all")
        results = []
        for pid in validate_pids(pids):
            result = await self._one(action, pid, reset_seq_nr)
            results.append(result)
            if on_done is not None:
                on_done(result)
        return results

    async def delete_all(
        self, pids: Iterable[str], *, reset_seq_nr: bool = False, on_done: Callable[[PidResult], None] | None = None
    ) -> list[PidResult]:
        return await self.run(CleanupAction.DELETE_ALL, pids, reset_seq_nr=reset_seq_nr, on_done=on_done)

    async def delete_snapshots(
        self, pids: Iterable[str], *, on_done: Callable[[PidResult], None] | None = None
    ) -> list[PidResult]:
        return await self.run(CleanupAction.DELETE_SNAPSHOTS, pids, on_done=on_done)

    async def delete_events_before_snapshot(
        self, pids: Iterable[str], *, on_done: Callable[[PidResult], None] | None = None
    ) -> list[PidResult]:
        return await self.run(CleanupAction.DELETE_BEFORE_SNAPSHOT, pids, on_done=on_done)

    async def _one(self, action: CleanupAction, pid: str, reset_seq_nr: bool) -> PidResult:
        before = await self.store.footprint(pid)
        skipped = None
        if action is CleanupAction.DELETE_BEFORE_SNAPSHOT and before.snapshot_seq_nr is None:
            skipped = "no snapshot"
        if self.dry_run:
            predicted = before if skipped else _predicted(action, before, reset_seq_nr)
            return PidResult(pid, action, before, predicted, skipped)
        if action is CleanupAction.DELETE_ALL:
            await self.store.delete_tag_rows(pid, keep_numbering=not reset_seq_nr)
            await self.store.delete_all_events(pid, reset_seq_nr=reset_seq_nr)
            await self.backend.delete_snapshot(pid)
        elif action is CleanupAction.DELETE_SNAPSHOTS:
            await self.backend.delete_snapshot(pid)
        elif before.snapshot_seq_nr is not None:
            await self.backend.delete_events_to(pid, before.snapshot_seq_nr)
        return PidResult(pid, action, before, await self.store.footprint(pid), skipped)


def _predicted(action: CleanupAction, before: PidFootprint, reset_seq_nr: bool) -> PidFootprint:
    """What ``action`` would leave of ``before`` (a dry run's "after"): the counts a real run
    reports, so "would delete N" and "deleted N" agree."""
    if action is CleanupAction.DELETE_ALL:
        return PidFootprint(before.persistence_id, 0, 0 if reset_seq_nr else before.highest_seq_nr, None, 0)
    if action is CleanupAction.DELETE_SNAPSHOTS:
        return replace(before, snapshot_seq_nr=None)
    snap, low = before.snapshot_seq_nr, before.lowest_seq_nr
    assert snap is not None  # a pid without a snapshot is skipped
    gone = 0 if low is None else max(0, min(snap, before.highest_seq_nr) - low + 1)
    left = max(0, before.events - gone)
    return replace(before, events=left, lowest_seq_nr=snap + 1 if left else None)
