"""Driver errors mapped into the library's error tree, in one place."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from ..errors import JournalError, JournalUnavailable, LocalWritesRefused, SliceRangeMoved, StorageError
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


def backoff_delays(settings: RetrySettings) -> list[float]:
    """Exponential backoff with jitter: the waits between ``attempts`` tries."""
    delays = []
    d = settings.initial_backoff
    for _ in range(settings.attempts - 1):
        delays.append(min(d, settings.max_backoff) * (0.5 + random.random() / 2))
        d *= 2
    return delays


async def with_retries(what: str, settings: RetrySettings, op: Callable[[], Awaitable[T]]) -> T:
    """Run an idempotent operation, retrying transient failures; then raise JournalUnavailable."""
    delays = backoff_delays(settings)
    for attempt in range(settings.attempts):
        try:
            return await op()
        except Exception as e:
            if not is_transient(e):
                moved = partition_refusal(e)
                if moved is not None:
                    raise moved from e
                raise
            if attempt >= len(delays):
                raise JournalUnavailable(
                    f"{what}: database unavailable after {settings.attempts} attempts: {e}"
                ) from e
            # DEBUG: a caller that keeps failing gets JournalUnavailable and reports the outage once
            log.debug("%s failed (%s), retry %d in %.2fs", what, e, attempt + 1, delays[attempt])
            await asyncio.sleep(delays[attempt])
    raise AssertionError("unreachable")


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
