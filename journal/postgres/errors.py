"""Driver errors mapped into the library's error tree, in one place."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import asyncpg

from ..errors import (
    ConfigurationError,
    JournalError,
    JournalUnavailable,
    LocalWritesRefused,
    SliceRangeMoved,
    StorageError,
)
from ..settings import RetrySettings

log = logging.getLogger("journal.postgres")

T = TypeVar("T")

LOCAL_WRITES_REFUSED_SQLSTATE = "SJ014"
"""Raised by the recovery guard (``journal.postgres.replication_store``) for a local write to a
replicated log that is being recovered from its peers."""
WAIT_SQLSTATE = "SJ025"
"""The owner check (:mod:`.timestamp_rule`): these slices are being moved; wait and retry."""
ELSEWHERE_SQLSTATE = "SJ026"
"""The owner check: this database does not serve these slices (now, or for this map epoch)."""

_TRANSIENT_SQLSTATE_PREFIXES = ("08", "57P", "53")  # connection, operator intervention, resources


def is_transient(exc: BaseException) -> bool:
    """True when the database was unreachable or went away (retrying may succeed)."""
    if isinstance(exc, OSError | asyncio.TimeoutError | ConnectionError):
        return True
    if isinstance(
        exc,
        asyncpg.exceptions.ConnectionDoesNotExistError
        | asyncpg.exceptions.InterfaceError
        | asyncpg.exceptions.CannotConnectNowError
        | asyncpg.exceptions.ConnectionFailureError
        | asyncpg.exceptions.InternalClientError,  # protocol state broken by a lost connection
    ):
        return not isinstance(exc, asyncpg.exceptions.InterfaceWarning)
    sqlstate = getattr(exc, "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate.startswith(_TRANSIENT_SQLSTATE_PREFIXES)


def connection_lost(conn: asyncpg.Connection, exc: BaseException) -> bool:
    """True when ``exc`` came from a connection that broke: a transient error, or any error once
    the connection is closed (ended mid-call, asyncpg may raise what it happens to meet, e.g.
    AttributeError from its protocol gone during a statement's type introspection)."""
    return is_transient(exc) or conn.is_closed()


def backoff_delays(settings: RetrySettings) -> list[float]:
    """Exponential backoff with jitter: the waits between ``attempts`` tries."""
    delays = []
    d = settings.initial_backoff
    for _ in range(settings.attempts - 1):
        delays.append(min(d, settings.max_backoff) * (0.5 + random.random() / 2))
        d *= 2
    return delays


_SETUP_SQLSTATE_PREFIXES = ("28", "3D", "3F", "42P01", "42703", "42501")
"""Answers that retrying will not change: authentication (28), a missing database (3D) or schema
(3F), a missing table or column (an unmigrated database), no privilege."""


def cause_of(exc: BaseException, timeout: float | None = None) -> str:
    """What went wrong, in words a person can act on (never empty)."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g} s" if timeout else "no answer in time"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (no server listens there)"
    if isinstance(exc, socket.gaierror):
        return f"unknown host ({exc.strerror})"
    if isinstance(exc, asyncpg.exceptions.PostgresError):
        hint = getattr(exc, "hint", None)
        return str(exc.message) + (f" ({hint})" if hint else "")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__


def driver_error(what: str, target: str, exc: BaseException, timeout: float | None = None) -> BaseException:
    """A driver error that retrying will not fix, as the library's error (others unchanged).

    Authentication, a missing database, schema or table are :class:`ConfigurationError`; any other
    refusal of the server :class:`StorageError`; each names the server and the cause."""
    if isinstance(exc, JournalError) or not isinstance(
        exc, asyncpg.exceptions.PostgresError | asyncpg.exceptions.InterfaceError
    ):
        return exc
    moved = partition_refusal(exc)
    if moved is not None:
        return moved
    sqlstate = getattr(exc, "sqlstate", None) or ""
    cause = cause_of(exc, timeout)
    if sqlstate.startswith(("28", "3D")):
        return ConfigurationError(f"cannot connect to {target}: {cause}")
    if sqlstate.startswith(_SETUP_SQLSTATE_PREFIXES):
        return ConfigurationError(
            f"{what} on {target}: {cause}: is the schema migrated? (run `journal migrate` against this database)"
            if sqlstate.startswith(("42P01", "42703", "3F"))
            else f"{what} on {target}: {cause}"
        )
    return StorageError(f"{what} on {target} failed: {cause}")


@contextmanager
def mapped_errors(what: str, target: str) -> Iterator[None]:
    """Statements run without retries (a command's own connection): a lost server becomes
    :class:`JournalUnavailable`, any other driver error the library's (:func:`driver_error`)."""
    try:
        yield
    except Exception as e:
        if is_transient(e):
            raise JournalUnavailable(f"{what}: {target} unavailable: {cause_of(e)}") from e
        error = driver_error(what, target, e)
        if error is e:
            raise
        raise error from e


async def with_retries(
    what: str,
    settings: RetrySettings,
    op: Callable[[], Awaitable[T]],
    *,
    target: str = "the database",
    connect_timeout: float | None = None,
    announce: bool = False,
) -> T:
    """Run an idempotent operation, retrying transient failures within ``attempts`` and
    ``budget``; then raise JournalUnavailable naming ``target`` and the cause. A failure that
    retrying cannot fix is raised at once, mapped by :func:`driver_error`. ``announce``: log each
    retry as a warning (a person is waiting: a CLI at start), else at debug level."""
    delays = backoff_delays(settings)
    loop = asyncio.get_running_loop()
    started = loop.time()
    for attempt in range(settings.attempts):
        waiting = _say_waiting(loop, target, connect_timeout) if announce and not attempt else None
        try:
            return await op()
        except Exception as e:
            if not is_transient(e):
                mapped = driver_error(what, target, e, connect_timeout)
                if mapped is e:
                    raise
                raise mapped from e
            cause = cause_of(e, connect_timeout)
            spent = loop.time() - started
            subject = f"cannot connect to {target}" if what == "connect" else f"{what}: {target} unavailable"
            # a try that timed out is tried again only if a whole new one ends within the budget:
            # a silent server costs one connect timeout with the defaults (10 s), not two
            next_try = connect_timeout if isinstance(e, TimeoutError) and connect_timeout else 0.0
            if attempt >= len(delays) or spent + delays[attempt] + next_try > settings.budget:
                tries = f"{attempt + 1} attempt{'s' if attempt else ''} in {spent:.1f} s"
                raise JournalUnavailable(f"{subject}: {cause} ({tries})") from e
            # a caller that keeps failing gets JournalUnavailable and reports the outage once
            (log.warning if announce else log.debug)(
                "%s: %s; retrying %d/%d in %.1f s", subject, cause, attempt + 2, settings.attempts, delays[attempt]
            )
            await asyncio.sleep(delays[attempt])
        finally:
            if waiting is not None:
                waiting.cancel()
    raise AssertionError("unreachable")


SAY_WAITING_AFTER = 2.0
"""Seconds of a first connection attempt without an answer after which a person is told what
the command waits for (a silent server is otherwise only said when the connect timeout ends)."""


def _say_waiting(
    loop: asyncio.AbstractEventLoop, target: str, connect_timeout: float | None
) -> asyncio.TimerHandle | None:
    if connect_timeout is None or connect_timeout <= SAY_WAITING_AFTER:
        return None
    return loop.call_later(
        SAY_WAITING_AFTER, log.warning, "waiting for %s to answer (up to %g s)", target, connect_timeout
    )


def partition_refusal(cause: BaseException) -> SliceRangeMoved | None:
    """The owner check's refusal (SQLSTATE SJ025/SJ026, the range as JSON in DETAIL) as a typed
    error; None for any other error."""
    sqlstate = getattr(cause, "sqlstate", None)
    if sqlstate not in (WAIT_SQLSTATE, ELSEWHERE_SQLSTATE):
        return None
    d = json.loads(getattr(cause, "detail", None) or "{}")
    return SliceRangeMoved(
        str(getattr(cause, "message", cause)), min_slice=int(d.get("min_slice") or 0),
        max_slice=int(d.get("max_slice") or 0), state=d.get("state"), epoch=int(d.get("epoch") or 0),
        location=d.get("location"), waiting=sqlstate == WAIT_SQLSTATE,
    )  # fmt: skip


def write_error(persistence_id: str, cause: BaseException) -> JournalError:
    """A write the database refused (not a conflict, not an outage) as a typed error."""
    moved = partition_refusal(cause)
    if moved is not None:
        moved.__cause__ = cause
        return moved
    if getattr(cause, "sqlstate", None) == LOCAL_WRITES_REFUSED_SQLSTATE:
        refused = LocalWritesRefused(f"write of {persistence_id!r} refused: {getattr(cause, 'message', cause)}")
        refused.__cause__ = cause
        return refused
    return StorageError(f"write of {persistence_id!r} failed: {cause}")
