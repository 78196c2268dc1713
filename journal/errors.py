"""One error tree for the whole library.

Every error the library raises derives from :class:`JournalError`, so a caller can catch
the family at once, and the few that a caller acts on are typed and documented.
Driver errors are mapped into this tree in one place per backend, with ``raise ... from``.
"""

from __future__ import annotations

import re

__all__ = [
    "CassandraSetupError",
    "CassandraStartError",
    "CircuitBreakerOpen",
    "ConditionTimeout",
    "ConfigurationError",
    "DestinationRefused",
    "DestinationUnavailable",
    "EntityError",
    "EntityStopped",
    "EventsMissing",
    "HandlerFailed",
    "IncompatibleVersion",
    "InvalidArgument",
    "JournalError",
    "JournalUnavailable",
    "KafkaPublishError",
    "KafkaSetupError",
    "KafkaStartError",
    "LeaseLost",
    "LocalWritesRefused",
    "LocationMismatch",
    "NotProjected",
    "OffsetError",
    "PersistNotAllowed",
    "ProjectionBusy",
    "ProjectionError",
    "RecoveryFailed",
    "ReplicationError",
    "RevisionConflict",
    "SequenceConflict",
    "SerializationError",
    "SliceRangeMoved",
    "SparkSetupError",
    "StashTimeout",
    "StorageError",
    "SubjectForgotten",
    "TagEventsMissing",
    "TagWriteTimeout",
    "UnknownProjection",
    "UnknownVersion",
    "UnsupportedOperation",
    "VersionNotReady",
]


_PASSWORD_IN_URL = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@]*:)[^\s@]*@")
_PASSWORD_PARAMETER = re.compile(r"(\bpassword=)[^&\s]*", re.IGNORECASE)


def mask_passwords(text: str) -> str:
    """``text`` with the password of every URL in it (``scheme://user:password@``) shown as
    ``***``: what every error message of this library and every line of its command lines'
    logs pass through, so that no password is printed (docs/scaling-out.md, "Credentials")."""
    return _PASSWORD_PARAMETER.sub(r"\1***", _PASSWORD_IN_URL.sub(r"\1***@", text))


def _with_detail(message: str, detail: str) -> str:
    """``message``, then ``: detail`` when there is one."""
    return f"{message}: {detail}" if detail else message


class JournalError(Exception):
    """Root of every error this library raises. A DSN's password in the message is masked."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(mask_passwords(a) if isinstance(a, str) else a for a in args))


class ConfigurationError(JournalError, ValueError):
    """A setting, DSN or identifier from configuration is invalid."""


class SparkSetupError(ConfigurationError):
    """Spark cannot run here: Java, the PostgreSQL JDBC driver or a TCP route to the database
    is missing. The message says what to install or configure."""


class CassandraSetupError(ConfigurationError):
    """A local Cassandra cannot be set up here: Java or Maven is missing, or Cassandra's jars
    cannot be resolved from Maven Central. The message says what to install."""


class CassandraStartError(JournalError):
    """A local Cassandra node did not come up (or died); the message ends with its log's tail."""


class KafkaSetupError(ConfigurationError):
    """A local Kafka broker cannot be set up here: Java or Maven is missing, or Kafka's jars cannot
    be resolved from Maven Central. The message says what to install."""


class KafkaStartError(JournalError):
    """A local Kafka broker did not come up (or died); the message ends with its log's tail."""


class InvalidArgument(JournalError, ValueError):
    """Bad input to a public call, raised before any I/O."""


class SerializationError(JournalError):
    """An event, metadata or snapshot could not be serialized or deserialized."""

    def located(self, where: str) -> SerializationError:
        """The same error, of the same type, with where it happened before its message."""
        return type(self)(f"{where}: {self}")


class UnknownVersion(SerializationError):
    """A stored row names a newer version of a registered type than this release reads
    (``shop:Placed#4`` while ``shop:Placed`` is registered at version 3): it was written by a
    newer release. Reading it as plain data would hand handlers a shape they do not expect; to
    read such rows, register a step from that version to yours (docs/schema-evolution.md)."""


class SubjectForgotten(InvalidArgument):
    """The subject's encryption key was deleted for good (crypto-shredding): nothing more is
    written for it (raised before anything is written)."""

    def __init__(self, subject: str) -> None:
        super().__init__(f"subject {subject!r} was forgotten: its key is deleted, nothing more can be written for it")
        self.subject = subject


class SequenceConflict(JournalError):
    """Another writer already took the sequence numbers this write needed.

    Nothing of the failed call was written. ``expected_seq_nr`` is what the call
    assumed (None when it asked for "after the current highest").
    """

    def __init__(self, persistence_id: str, expected_seq_nr: int | None, detail: str = "") -> None:
        self.persistence_id = persistence_id
        self.expected_seq_nr = expected_seq_nr
        at = "" if expected_seq_nr is None else f" (expected highest seq_nr {expected_seq_nr})"
        super().__init__(_with_detail(f"sequence conflict for {persistence_id!r}{at}", detail))


class RevisionConflict(JournalError):
    """A durable state upsert or delete at ``revision`` found the pid at another revision than
    ``revision - 1`` (``found``; None: no row). Nothing of it was written (docs/durable-state.md)."""

    def __init__(self, persistence_id: str, revision: int, found: int | None) -> None:
        self.persistence_id = persistence_id
        self.revision = revision
        self.found = found
        at = "no stored state" if found is None else f"stored revision {found}"
        super().__init__(
            f"revision conflict for {persistence_id!r}: revision {revision} needs revision {revision - 1}, found {at}"
        )


class JournalUnavailable(JournalError):
    """The storage could not be reached after bounded retries (a transient condition).

    ``outcome_unknown`` is True for a write that was sent but whose commit could not be
    confirmed or ruled out: the events may or may not be stored. See README, "Writes whose
    outcome is unknown".
    """

    def __init__(self, message: str, *, outcome_unknown: bool = False) -> None:
        self.outcome_unknown = outcome_unknown
        super().__init__(message)


class SliceRangeMoved(JournalUnavailable):
    """A database refused an operation on slices it does not serve now: they moved to another
    database, they are being moved (``waiting``: a fenced range's writes, or a moving range's
    deletes, wait for the move), or the caller's partition map is older than the range's.
    Nothing was written. A partitioned journal reloads its map and retries on its own (see
    docs/scaling-out.md); a journal opened on one database without ``partitions.databases``
    raises it: reopen it with that setting."""

    def __init__(
        self, message: str, *, min_slice: int, max_slice: int, state: str | None, epoch: int, location: str | None,
        waiting: bool,
    ) -> None:  # fmt: skip
        super().__init__(message, outcome_unknown=False)
        self.min_slice = min_slice
        self.max_slice = max_slice
        self.state = state
        self.epoch = epoch
        self.location = location
        self.waiting = waiting


class StorageError(JournalError):
    """The database rejected an operation for a reason other than a conflict or an outage."""


class UnsupportedOperation(JournalError):
    """The backend cannot serve this operation (for example slice queries on Cassandra)."""


class OffsetError(InvalidArgument):
    """An offset of the wrong kind, or one that does not fit the query."""


class EventsMissing(JournalError):
    """Events that must exist are really absent from the journal (not merely late)."""

    def __init__(self, persistence_id: str, from_seq_nr: int, to_seq_nr: int, detail: str = "") -> None:
        self.persistence_id = persistence_id
        self.from_seq_nr = from_seq_nr
        self.to_seq_nr = to_seq_nr
        msg = f"events {from_seq_nr}..{to_seq_nr} of {persistence_id!r} are missing"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class TagEventsMissing(EventsMissing):
    """An events-by-tag query found a gap in a pid's tag numbering that did not fill in time.

    ``from_seq_nr``/``to_seq_nr`` are the missing *tag_pid_sequence_nr* range of ``tag``.
    """

    def __init__(self, persistence_id: str, tag: str, from_nr: int, to_nr: int, detail: str = "") -> None:
        self.tag = tag
        EventsMissing.__init__(self, persistence_id, from_nr, to_nr, detail)
        self.args = (
            f"tagged events of {persistence_id!r} under tag {tag!r} with tag_pid_sequence_nr "
            f"{from_nr}..{to_nr} are missing" + (f": {detail}" if detail else ""),
        )

    def __str__(self) -> str:
        return str(self.args[0])


class ProjectionError(JournalError):
    """A projection cannot go on (see the subclasses)."""


class KafkaPublishError(ProjectionError):
    """Events could not be published to Kafka: the broker refused a record or a transaction (a
    missing topic, a record over the size limit). A producer fenced by a newer one of its range
    is not this: an outage, or :class:`LeaseLost` (docs/kafka.md, "A fenced producer")."""


class DestinationUnavailable(ProjectionError):
    """A projection handler's destination does not answer (a Kafka publisher's brokers are down).

    Raised by a handler, it is an outage, not the handler's failure: the runner rolls the batch
    back and retries it with backoff without limit, without counting it toward ``handler_attempts``,
    logs it once per outage and shows it in the worker's row of ``projections status`` as
    ``<destination> unavailable since ...`` (docs/outages.md)."""

    def __init__(self, message: str, *, destination: str) -> None:
        super().__init__(message)
        self.destination = destination
        """What is unavailable, as ``projections status`` words it (``Kafka``)."""


class DestinationRefused(ProjectionError, ConfigurationError):
    """A projection handler's destination refuses the projection itself: its credentials (a wrong
    password) or its permissions (an ACL denying the topic or the transactional id).

    Raised by a handler, it stops the projection at once: not retried, not counted toward
    ``handler_attempts`` and never a dead letter (every event would be refused alike); the
    worker's ``run`` raises it, ``projections run`` says it in one line with exit code 2."""


class LeaseLost(ProjectionError):
    """This worker no longer owns a slice it was processing (another worker took it over).

    Raised inside the offset transaction, which is then rolled back: nothing was committed for
    the lost slices. The worker stops processing them; it is not a failure of the projection.
    """


class HandlerFailed(ProjectionError):
    """A projection handler kept failing after its bounded retries; the projection stopped."""

    def __init__(self, message: str, *, stored: str | None = None) -> None:
        super().__init__(message)
        self.stored = message if stored is None else stored
        """What is kept in the database for ``projections status``: without the handler's own
        error text when the journal encrypts (that text may quote an event's data, and a stored
        copy would survive forgetting its subject)."""


class ProjectionBusy(ProjectionError):
    """Live workers hold the projection: stop ``projections run NAME`` before a backfill."""


class UnknownProjection(ProjectionError, InvalidArgument):
    """No projection of that name has run against this database (no worker, offset or pause
    stored): waiting for it would never end."""


class NotProjected(ProjectionError, InvalidArgument):
    """The write cannot be waited for on that projection: its events are of another entity
    type than the projection processes (another projection's range of events)."""


class VersionNotReady(ProjectionError, InvalidArgument):
    """A projection version cannot be switched to, run or dropped as asked: it has not caught
    up with the serving version, has no tables yet, is retired, still serves, or still has
    running workers (the message says which; nothing was changed)."""


class TagWriteTimeout(JournalUnavailable):
    """The tag view write did not finish within ``tag_write_timeout``. The events are stored;
    the pid's next recovery (its next write through this journal) resends the tag rows.

    ``outcome_unknown`` is True: the call's events may be (here: are) stored, so a caller must
    read before writing them again (``outcome_unknown=False`` promises nothing was written)."""

    def __init__(self, message: str, *, outcome_unknown: bool = True) -> None:
        super().__init__(message, outcome_unknown=outcome_unknown)


class CircuitBreakerOpen(JournalUnavailable):
    """Entities' circuit breaker is open after repeated write failures: rejected without I/O.

    Nothing was sent, so nothing was written (``outcome_unknown`` is False). The breaker lets a
    trial write through after ``entities.breaker_reset_timeout`` and closes when one succeeds.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, outcome_unknown=False)


class EntityError(JournalError):
    """Misuse of the entity programming model or an entity that cannot run."""


class PersistNotAllowed(EntityError):
    """``persist``/``persist_all``/``save_snapshot`` called outside that entity's command handler
    (for example from an event handler, a callback or another entity)."""


class EntityStopped(EntityError):
    """The entity stopped (passivated, registry closed) while this command was stashed."""


class RecoveryFailed(EntityError):
    """An entity could not be recovered; it is not used, and its waiting commands get this error.

    ``seq_nr`` is the event whose handler failed (None when loading failed for another reason).
    """

    def __init__(self, persistence_id: str, seq_nr: int | None, detail: str = "") -> None:
        self.persistence_id = persistence_id
        self.seq_nr = seq_nr
        at = "" if seq_nr is None else f" at seq_nr {seq_nr}"
        super().__init__(_with_detail(f"recovery of {persistence_id!r} failed{at}", detail))


class ReplicationError(JournalError):
    """Replication between locations cannot go on (see the subclasses)."""


class LocationMismatch(ReplicationError, ConfigurationError):
    """A database already belongs to another location: one location, one database."""


class IncompatibleVersion(ReplicationError):
    """The target's application version is older than the source's (same application name):
    replication is refused so the older version never sees events it may not understand."""


class LocalWritesRefused(ReplicationError):
    """The location is being recovered from its peers; local writes wait until it completes."""


class StashTimeout(EntityError, TimeoutError):
    """A stashed command stayed stashed longer than ``stash_timeout`` seconds: it was not handled
    (nothing of it was written) and left the stash."""


class ConditionTimeout(EntityError, TimeoutError):
    """A conditional request gave up: the view or entity had not seen the requested vector time
    within the timeout. ``missing`` maps each unmet entry to (wanted, seen)."""

    def __init__(self, component: str, missing: dict[str, tuple[int, int]], timeout: float) -> None:
        self.component = component
        self.missing = missing
        self.timeout = timeout
        shown = ", ".join(f"{k}: {s} < {w}" for k, (w, s) in sorted(missing.items())[:5])
        super().__init__(f"{component} had not seen the requested vector time after {timeout}s ({shown})")
