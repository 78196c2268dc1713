"""Live events of several entity types, each resumed from its own offset (for views and the router).

One live slice query per entity type over a slice range (all slices by default); each envelope
is handed to ``handle`` and only then becomes the type's offset, so an offset saved at any moment
covers exactly the events already handled. Per persistence id the order is the journal's (seq_nr
order); across types the streams run side by side.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from ..envelope import EventEnvelope
from ..ids import NUMBER_OF_SLICES, validate_entity_type
from ..journal import Journal
from ..offsets import TimestampOffset

log = logging.getLogger("journal.entities")

Handle = Callable[[EventEnvelope, TimestampOffset], Awaitable[None]]
"""Called with each envelope and the query's offset after it (where to resume)."""


def offsets_to_json(offsets: Mapping[str, TimestampOffset]) -> dict[str, Any]:
    return {t: o.to_json() for t, o in offsets.items()}


def offsets_from_json(data: Any) -> dict[str, TimestampOffset]:
    if not isinstance(data, dict):
        return {}
    return {str(t): TimestampOffset.from_json(o) for t, o in data.items()}


class TypeStreams:
    """Runs one task per entity type; :meth:`stop` cancels them; a failing ``handle`` stops all
    and is kept in :attr:`error` (and ``on_error`` is called). With ``track_offsets=False`` the
    owner records offsets itself (when what ``handle`` started has finished)."""

    def __init__(
        self,
        journal: Journal,
        entity_types: Iterable[str],
        offsets: dict[str, TimestampOffset],
        handle: Handle,
        *,
        name: str,
        on_error: Callable[[BaseException], None] = lambda e: None,
        track_offsets: bool = True,
        slices: tuple[int, int] = (0, NUMBER_OF_SLICES - 1),
    ) -> None:
        """``slices``: the range each type is read over (default: all)."""
        self.journal = journal
        self.slices = slices
        self.entity_types = tuple(sorted({validate_entity_type(t) for t in entity_types}))
        self.offsets = offsets
        """entity type -> offset of the last handled envelope (shared with the owner)."""
        self._handle = handle
        self._name = name
        self._on_error = on_error
        self._track = track_offsets
        self.error: BaseException | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(t), name=f"{self._name} stream {t}") for t in self.entity_types]

    async def stop(self) -> None:
        """Cancel the streams, again until each has ended (a wait inside the query may swallow
        one cancellation on Python < 3.12)."""
        for t in self._tasks:
            while not t.done():
                t.cancel()
                await asyncio.wait([t], timeout=0.5)
            if not t.cancelled():
                t.exception()  # retrieved: failures are reported through ``error``
        self._tasks = []

    async def _run(self, entity_type: str) -> None:
        try:
            lo, hi = self.slices
            query = self.journal.events_by_slices(entity_type, lo, hi, self.offsets.get(entity_type))
            async for env in query:
                offset = env.offset  # the query's position (a loaded envelope carries its own)
                if not isinstance(offset, TimestampOffset):
                    continue
                if not env.has_payload:  # found by a payload-free backtracking read
                    loaded = await self.journal.load_envelope(env.persistence_id, env.seq_nr)
                    if loaded is None:
                        continue
                    env = loaded
                await self._handle(env, offset)
                if self._track:
                    self.offsets[entity_type] = offset
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            log.error("%s stopped: %s: %s", self._name, type(e).__name__, e)
            self.error = e
            me = asyncio.current_task()
            for t in self._tasks:  # one type failing stops the component
                if t is not me:
                    t.cancel()
            self._on_error(e)
