"""A projection that starts from snapshots: its snapshot hook beside its handler.

``Worker(..., from_snapshots=True, snapshot_handler=hook)`` (``projections run NAME
--from-snapshots --snapshot-handler module:callable``) reads each range with
``Journal.event_pages_by_slices_starting_from_snapshots``: a pid's latest snapshot comes as an
envelope with ``source == "snapshot"`` (``event`` the state as of its ``seq_nr``), then only the
pid's events after it. The hook turns that state into the read model's state for the pid (it
replaces what the model held for it); it is called as the handler of the projection's mode is:
``hook(conn, envelope)`` (exactly-once), ``hook(conn, envelopes)`` (grouped: the snapshots of a
batch, in the batch's order around its events) or ``hook(envelope)`` (at-least-once), in the same
transaction, with the same offsets and the same failure strategy. Without a hook the handler
receives the snapshot envelopes itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from itertools import groupby
from typing import Any

from journal.envelope import SNAPSHOT_SOURCE, EventEnvelope

from .handlers import Mode, check_handler

Handler = Callable[..., Awaitable[None]]


def _is_snapshot(env: EventEnvelope) -> bool:
    return env.source == SNAPSHOT_SOURCE


def with_snapshot_handler(handler: Handler, hook: Handler, mode: Mode) -> Handler:
    """One handler of ``mode`` that hands snapshot envelopes to ``hook`` and the others to
    ``handler``, in their order (``hook`` checked for ``mode`` as the handler is)."""
    hook = check_handler(hook, mode, "snapshot handler")
    if mode == "grouped":

        async def grouped(conn: Any, envs: Sequence[EventEnvelope]) -> None:
            for snapshots, run in groupby(envs, _is_snapshot):
                await (hook if snapshots else handler)(conn, list(run))

        return grouped
    if mode == "exactly-once":

        async def exactly_once(conn: Any, env: EventEnvelope) -> None:
            await (hook if _is_snapshot(env) else handler)(conn, env)

        return exactly_once

    async def at_least_once(env: EventEnvelope) -> None:
        await (hook if _is_snapshot(env) else handler)(env)

    return at_least_once
