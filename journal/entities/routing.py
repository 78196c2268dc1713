"""Event routing: extra destination aggregate ids stored with the event.

The journal keeps one metadata value per persist call, so routes are stored keyed by sequence
number: ``{"destinations": {"7": ["account|b"]}}``. Replays (by pid or by slices) carry the same
metadata, so :func:`destinations_of` and :func:`routed_to` answer the same way every time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..envelope import EventEnvelope


def routes_metadata(
    first_seq_nr: int, destinations: Sequence[tuple[str, ...]]
) -> dict[str, Any] | None:
    """Metadata for one persist call (None when no event names a destination)."""
    routes = {str(first_seq_nr + i): list(d) for i, d in enumerate(destinations) if d}
    return {"destinations": routes} if routes else None


def destinations_of(envelope: EventEnvelope) -> tuple[str, ...]:
    """The extra aggregate ids the event was routed to at persist time (may be empty)."""
    meta = envelope.metadata
    if not isinstance(meta, dict):
        return ()
    routes = meta.get("destinations")
    if not isinstance(routes, dict):
        return ()
    return tuple(routes.get(str(envelope.seq_nr), ()))


def routed_to(envelope: EventEnvelope, aggregate_id: str) -> bool:
    """True when the event was emitted by ``aggregate_id`` (its pid) or routed to it."""
    return envelope.persistence_id == aggregate_id or aggregate_id in destinations_of(envelope)
