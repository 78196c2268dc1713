"""Per-pid gap detection of the events-by-tag query (a plain class, driven step by step).

Every tag row carries ``tag_pid_seq_nr`` (1, 2, 3, ... per (tag, pid)). The tracker keeps the
last delivered number per pid and classifies each row: deliver, duplicate (already delivered),
gap (rows missing before it: hold it and search), or first sight of a pid whose number is not 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Verdict(Enum):
    DELIVER = "deliver"
    DUPLICATE = "duplicate"
    GAP = "gap"
    UNKNOWN_PID = "unknown_pid"


@dataclass
class PidTracker:
    """``accept_unknown``: a pid seen for the first time is accepted at any number (the query
    started in a past bucket, or the new-pid scan timeout is 0)."""

    accept_unknown: bool
    expected: dict[str, int] = field(default_factory=dict)

    def classify(self, pid: str, tag_pid_seq_nr: int) -> Verdict:
        last = self.expected.get(pid)
        if last is None:
            if tag_pid_seq_nr == 1 or self.accept_unknown:
                return Verdict.DELIVER
            return Verdict.UNKNOWN_PID
        if tag_pid_seq_nr <= last:
            return Verdict.DUPLICATE
        if tag_pid_seq_nr == last + 1:
            return Verdict.DELIVER
        return Verdict.GAP

    def missing(self, pid: str, tag_pid_seq_nr: int) -> tuple[int, int]:
        """The inclusive range of numbers missing before ``tag_pid_seq_nr``."""
        return self.expected.get(pid, 0) + 1, tag_pid_seq_nr - 1

    def delivered(self, pid: str, tag_pid_seq_nr: int) -> None:
        self.expected[pid] = tag_pid_seq_nr

    def seed(self, pid: str, lowest_seen: int) -> None:
        """Scanning at the start: expect the lowest number seen for the pid next."""
        if pid not in self.expected or self.expected[pid] > lowest_seen - 1:
            self.expected[pid] = lowest_seen - 1
