"""A worker's view of database outages: which failures are the database's, and how long it has
been unavailable.

A failure to get a connection, or a connection lost under a transaction, is the database's, not
the handler's: it must not count toward ``handler_attempts`` (a worker would otherwise exit after
a few seconds of outage). Such failures are retried without limit, with backoff, logged once per
outage (and when it ends), and shown in the worker's row of ``projections status``. So is a
handler's :class:`~journal.errors.DestinationUnavailable` (a Kafka publisher's brokers down),
worded for its destination.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from journal.conditions import Condition
from journal.errors import JournalUnavailable
from journal.postgres import is_transient


def database_unavailable(exc: BaseException, *, in_handler: bool = False, conn_lost: bool = False) -> bool:
    """True when ``exc`` means the database (not the handler) failed.

    Outside the handler: any transient connection error (refused, reset, closed, server shutting
    down or starting) or JournalUnavailable. Inside the handler: only when our transaction's
    connection is gone too (``conn_lost``); a handler's own error that merely looks transient
    (its own HTTP call refused) stays the handler's.
    """
    if in_handler:
        return conn_lost
    return isinstance(exc, JournalUnavailable) or is_transient(exc)


class Outage:
    """One per worker, shared by its lease loop and its processors."""

    def __init__(self, log: logging.Logger, who: str, quiet: float) -> None:
        self.who = who
        self.condition = Condition(log, logging.WARNING, quiet=quiet)
        self.detail = ""
        self.subject = "database"
        """What is (or was last) unavailable: the database, or a handler's destination (``Kafka``)."""
        self.last: tuple[datetime, datetime] | None = None
        """The latest outage that ended: (from, to)."""

    @property
    def active(self) -> bool:
        return self.condition.active

    def failed(self, what: str, exc: BaseException, subject: str = "database") -> None:
        self.detail = f"{what}: {type(exc).__name__}: {exc}"
        self.subject = subject
        self.condition.occurred("%s: %s unavailable (%s)", self.who, subject, self.detail)

    def answered(self) -> None:
        """Something reached the database: the outage ends after the condition's quiet time."""
        since = self.condition.since
        self.condition.idle(f"{self.who}: {self.subject} available again")
        if since is not None and not self.condition.active:
            self.last = (since, datetime.now(UTC))

    def note(self) -> str | None:
        """For the worker row's ``error`` column while it runs (``projections status``)."""
        c = self.condition
        if c.since is not None:
            since = c.since.isoformat(timespec="seconds")
            return f"{self.subject} unavailable since {since} ({c.count} failures), last: {self.detail}"
        if self.last is not None:
            a, b = self.last
            return (
                f"{self.subject} was unavailable from {a.isoformat(timespec='seconds')} to "
                f"{b.isoformat(timespec='seconds')} ({(b - a).total_seconds():.0f}s); riding through"
            )
        return None
