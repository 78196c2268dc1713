"""Validation of envelopes against the offset store: duplicate, accept, or gap.

A plain class with no I/O, so it can be driven step by step (and by property tests). It holds,
per slice, the stored offset (the latest timestamp and the pids seen at exactly it) and a
bounded window of the latest sequence number per pid. Envelopes are checked inside a *pending*
overlay that the runner commits after the offset transaction commits, or rolls back with it.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from journal.envelope import EventEnvelope


class Verdict(enum.Enum):
    DUPLICATE = "duplicate"
    """Already processed: skip it."""
    ACCEPT = "accept"
    """Next in sequence (or the first event of a pid): process it."""
    GAP = "gap"
    """Events of this pid are missing before it: replay ``gap_from..seq_nr-1`` first."""
    UNKNOWN = "unknown"
    """A pid this store does not hold in memory with seq_nr > 1: look it up (store, then journal)."""


@dataclass(frozen=True, slots=True)
class Check:
    verdict: Verdict
    gap_from: int = 0
    """For GAP: the first missing sequence number."""


_ACCEPT = Check(Verdict.ACCEPT)
_DUPLICATE = Check(Verdict.DUPLICATE)
_UNKNOWN = Check(Verdict.UNKNOWN)


@dataclass(slots=True)
class SliceState:
    """What the store knows of one slice."""

    latest: datetime | None = None
    """Timestamp of the slice's latest offset row (None: nothing processed yet)."""
    seen_at_latest: dict[str, int] = field(default_factory=dict)
    """pid -> seq_nr of the events processed at exactly ``latest``."""
    pids: dict[str, tuple[int, datetime]] = field(default_factory=dict)
    """pid -> (latest processed seq_nr, its timestamp), within the time window."""

    def covers(self, ts: datetime, pid: str, seq_nr: int) -> bool:
        """True when the slice offset says this event was already processed (horizon mode only:
        there delivery is ordered by db_timestamp, so nothing commits below a processed event)."""
        if self.latest is None or ts > self.latest:
            return False
        if ts < self.latest:
            return True
        seen = self.seen_at_latest.get(pid)
        return seen is not None and seq_nr <= seen


class Validator:
    """Per-slice offsets and per-pid sequence numbers of one slice range.

    ``check`` never mutates committed state; ``record`` writes into the pending overlay;
    ``commit`` folds the overlay in (after the transaction committed), ``rollback`` drops it.
    """

    def __init__(self, window: timedelta, max_pids: int = 1_000_000) -> None:
        self.window = window
        self.max_pids = max_pids
        self.slices: dict[int, SliceState] = {}
        self._pending: dict[str, tuple[int, int, datetime]] = {}  # pid -> (slice, seq_nr, ts)
        self._size = 0

    # -- loading -----------------------------------------------------------------------------

    def load_slice(self, slice_: int, latest: datetime | None, rows: list[tuple[str, int, datetime]]) -> None:
        """Install a slice's stored state: ``rows`` are (pid, seq_nr, timestamp) within the window."""
        st = SliceState(latest=latest)
        for pid, seq_nr, ts in rows:
            if not pid:  # heartbeat row
                continue
            st.pids[pid] = (seq_nr, ts)
            if latest is not None and ts == latest:
                st.seen_at_latest[pid] = seq_nr
        self._size += len(st.pids) - len(self.slices.get(slice_, SliceState()).pids)
        self.slices[slice_] = st

    def learn(self, slice_: int, pid: str, seq_nr: int, ts: datetime) -> None:
        """Install a pid looked up lazily (from the store) as committed state."""
        st = self.slices.setdefault(slice_, SliceState())
        if pid not in st.pids:
            self._size += 1
        st.pids[pid] = (seq_nr, ts)

    # -- checking ----------------------------------------------------------------------------

    def known_seq_nr(self, slice_: int, pid: str) -> int | None:
        pending = self._pending.get(pid)
        if pending is not None:
            return pending[1]
        st = self.slices.get(slice_)
        if st is None:
            return None
        known = st.pids.get(pid)
        return known[0] if known is not None else None

    def check(self, env: EventEnvelope, *, per_pid: bool = False) -> Check:
        """Classify one envelope (no side effect).

        A pid not in memory is judged by the slice offset in horizon mode. With ``per_pid``
        (backtracking mode: an event may commit late, below offsets already stored for its slice)
        only by its own record: a first event newer than the window behind the slice's latest
        offset is new (a processed one would be in memory); anything else is UNKNOWN, for the
        runner to look up in the store and then the journal (``window_start``).
        """
        # the per-event hot path of every projection: each envelope field is read once
        pid, seq_nr, slice_ = env.persistence_id, env.seq_nr, env.slice
        known = self.known_seq_nr(slice_, pid)
        if known is not None:
            if seq_nr <= known:
                return _DUPLICATE
            if seq_nr == known + 1:
                return _ACCEPT
            return Check(Verdict.GAP, gap_from=known + 1)
        if per_pid:
            start = self.window_start(slice_)
            if seq_nr == 1 and (start is None or env.db_timestamp >= start):
                return _ACCEPT
            return _UNKNOWN
        if self.covered_by_slice(slice_, env.db_timestamp, pid, seq_nr):
            return _DUPLICATE
        if seq_nr == 1:
            return _ACCEPT
        return _UNKNOWN

    def admits_snapshot(self, env: EventEnvelope, *, per_pid: bool = False) -> bool:
        """A snapshot envelope (the query from snapshots) is processed unless the pid is already
        at or past its seq_nr: it stands for every event up to it, so it is never a gap and never
        needs the pid's earlier events. A pid not in memory (the runner looks it up in the store
        first) is judged by the slice offset in horizon mode; in backtracking mode it is new."""
        known = self.known_seq_nr(env.slice, env.persistence_id)
        if known is not None:
            return env.seq_nr > known
        return per_pid or not self.covered_by_slice(env.slice, env.db_timestamp, env.persistence_id, env.seq_nr)

    def accept_next(
        self, envs: Sequence[EventEnvelope], start: int, accepted: list[EventEnvelope], *, per_pid: bool = False
    ) -> int:
        """The common case of a batch in one loop: from ``envs[start]`` on, each envelope that
        :meth:`check` accepts is recorded and appended to ``accepted``; returns the index of the
        first that is not accepted (a heartbeat, a duplicate, a gap, an unknown pid: the caller
        checks it and goes on after it), or ``len(envs)``."""
        pending, slices = self._pending, self.slices
        for i in range(start, len(envs)):
            env = envs[i]
            if env.source == "heartbeat":
                return i
            pid, seq_nr = env.persistence_id, env.seq_nr
            known = pending.get(pid)
            if known is None:
                st = slices.get(env.slice)
                stored = st.pids.get(pid) if st is not None else None
                if stored is None and self.check(env, per_pid=per_pid) is not _ACCEPT:
                    return i
                if stored is not None and seq_nr != stored[0] + 1:
                    return i
            elif seq_nr != known[1] + 1:
                return i
            pending[pid] = (env.slice, seq_nr, env.db_timestamp)
            accepted.append(env)
        return len(envs)

    def window_start(self, slice_: int) -> datetime | None:
        """The time window's start behind the slice's latest offset (None: nothing stored yet).
        Every pid with a processed event at or after it is in memory."""
        st = self.slices.get(slice_)
        return None if st is None or st.latest is None else st.latest - self.window

    def covered_by_slice(self, slice_: int, ts: datetime, pid: str, seq_nr: int) -> bool:
        st = self.slices.get(slice_)
        return st is not None and st.covers(ts, pid, seq_nr)

    def record(self, env: EventEnvelope) -> None:
        """Note an accepted envelope in the pending overlay (it is now ``known``)."""
        self._pending[env.persistence_id] = (env.slice, env.seq_nr, env.db_timestamp)

    @property
    def pending(self) -> dict[str, tuple[int, int, datetime]]:
        """pid -> (slice, seq_nr, timestamp) accepted since the last commit: the offset rows to store."""
        return self._pending

    def rollback(self) -> None:
        self._pending = {}

    def commit(self, heartbeat_slices: dict[int, datetime] | None = None) -> None:
        """Fold the pending overlay (and heartbeat offsets) into the committed state."""
        for pid, (slice_, seq_nr, ts) in self._pending.items():
            st = self.slices.setdefault(slice_, SliceState())
            if pid not in st.pids:
                self._size += 1
            st.pids[pid] = (seq_nr, ts)
            if st.latest is None or ts > st.latest:
                st.latest = ts
                st.seen_at_latest = {pid: seq_nr}
            elif ts == st.latest:
                st.seen_at_latest[pid] = seq_nr
        for slice_, ts in (heartbeat_slices or {}).items():
            st = self.slices.setdefault(slice_, SliceState())
            if st.latest is None or ts > st.latest:
                st.latest = ts
                st.seen_at_latest = {}
        self._pending = {}
        if self._size > self.max_pids:
            self.evict()

    def evict(self) -> int:
        """Forget pids older than the window behind their slice's latest offset; return how many."""
        removed = 0
        for st in self.slices.values():
            if st.latest is None:
                continue
            cutoff = st.latest - self.window
            old = [pid for pid, (_, ts) in st.pids.items() if ts < cutoff]
            for pid in old:
                del st.pids[pid]
            removed += len(old)
        self._size -= removed
        return removed

    def start_timestamp(self, slices: range) -> datetime | None:
        """Where a query over ``slices`` resumes: the earliest latest offset (None: from the start)."""
        latest: list[datetime] = []
        for s in slices:
            st = self.slices.get(s)
            if st is None or st.latest is None:
                return None
            latest.append(st.latest)
        return min(latest) if latest else None
