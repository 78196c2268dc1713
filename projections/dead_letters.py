"""The dead letters of a projection: list them, apply them again, or discard them (issue 26).

A retry applies each dead letter with the projection's (fixed) handler in one transaction that
also deletes the dead letter, so it is applied once even when two retries run at once. Dead
letters are applied in the events' order; when one fails again, the later ones of the same
persistence id wait (they are not applied before it).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Protocol

from journal.envelope import EventEnvelope
from journal.serialization import SerializerRegistry

from .dead_letter_store import DeadLetter, DeadLetterSql, sealed
from .handlers import Mode
from .recovery import Failures


class EventLoader(Protocol):
    """What a retry needs of a journal: one event with its payload (``Journal.load_envelope``),
    and its serializers (a dead letter that fails again is sealed as the runner seals it)."""

    serializers: SerializerRegistry

    async def load_envelope(self, persistence_id: str, seq_nr: int) -> EventEnvelope | None: ...


@dataclass
class RetryResult:
    applied: list[DeadLetter] = field(default_factory=list)
    failed: list[tuple[DeadLetter, str]] = field(default_factory=list)
    """Dead letters whose handler failed again (kept, their attempts counted), with the error."""
    waiting: list[DeadLetter] = field(default_factory=list)
    """Later dead letters of a persistence id whose earlier one failed again (not tried)."""
    missing: list[DeadLetter] = field(default_factory=list)
    """Dead letters whose event is no longer in the journal (deleted): kept; discard them."""
    gone: int = 0
    """Dead letters another retry or a discard took first (not applied here)."""


async def retry(
    journal: EventLoader, conn: Any, sql: DeadLetterSql, name: str, handler: Callable[..., Awaitable[None]],
    mode: Mode, *, persistence_id: str | None = None, seq_nr: int | None = None,
) -> RetryResult:  # fmt: skip
    """Apply the dead letters of ``name`` (or of one pid, or one event) with ``handler``."""
    out = RetryResult()
    blocked: set[str] = set()
    for letter in await sql.letters(conn, name):
        pid = letter.persistence_id
        if (persistence_id is not None and pid != persistence_id) or (seq_nr is not None and letter.seq_nr != seq_nr):
            continue
        if pid in blocked:
            out.waiting.append(letter)
            continue
        env = await journal.load_envelope(pid, letter.seq_nr)
        if env is None:
            out.missing.append(letter)
            blocked.add(pid)
            continue
        failures = Failures()
        try:
            took = await _apply(conn, sql, name, letter, env, handler, mode)
        except Exception as e:
            failures.failed(e)
            error, tb = await sealed(journal.serializers, pid, failures.message, failures.traceback)
            await sql.failed_again(conn, name, pid, letter.seq_nr, error, tb)
            out.failed.append((letter, failures.message))
            blocked.add(pid)
            continue
        if took:
            out.applied.append(letter)
        else:
            out.gone += 1
    return out


async def _apply(
    conn: Any, sql: DeadLetterSql, name: str, letter: DeadLetter, env: EventEnvelope,
    handler: Callable[..., Awaitable[None]], mode: Mode,
) -> bool:  # fmt: skip
    if mode == "at-least-once":  # no transaction of the handler's: it runs, then the letter goes
        await handler(env)
        async with conn.transaction():
            return await sql.take(conn, name, letter.persistence_id, letter.seq_nr)
    async with conn.transaction():
        if not await sql.take(conn, name, letter.persistence_id, letter.seq_nr):
            return False
        if mode == "grouped":
            await handler(conn, [env])
        else:
            await handler(conn, env)
        return True


def letters_json(letters: list[DeadLetter]) -> str:
    """``projections dead-letters list --json``: one object per dead letter, times in ISO 8601."""

    def default(value: Any) -> Any:
        if isinstance(value, datetime):
            return value.isoformat()
        raise TypeError(f"not JSON: {type(value).__name__}")

    return json.dumps([asdict(d) for d in letters], default=default, indent=2)
