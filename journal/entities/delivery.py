"""Delivering routed events into a destination entity, exactly once per source event.

The router sends a :class:`RoutedDelivery` to the destination's cell like a command. The cell
runs :func:`routed_handler` instead of the entity's command handler: it drops every event at or
below the entity's route mark for its source (already delivered: a re-delivery after a router
restart) and collects the rest as ordinary events of the destination, marked with their source.
The marks are part of the entity's state as rebuilt by recovery (see routing.py), and the write
is checked against the pid's highest seq_nr, so the check and the write are one step of the
pid's single writer: a concurrent writer makes the write fail (SequenceConflict), the entity
restarts, and the re-sent delivery is checked again against the fresh marks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .entity import Entity
from .routing import route_marks


@dataclass(frozen=True, slots=True)
class RoutedEvent:
    """One routed event: the source's pid and seq_nr identify it; ``event`` is its payload."""

    source_pid: str
    source_seq_nr: int
    event: Any


@dataclass(frozen=True, slots=True)
class RoutedDelivery:
    """Internal command: routed events for one destination, in source order. Reply: how many
    were new (the others had been delivered before)."""

    events: tuple[RoutedEvent, ...]


def routed_handler(entity: Entity[Any], command: Any) -> Callable[[Any], Any] | None:
    """The handler for a :class:`RoutedDelivery` (None for any other command)."""
    if not isinstance(command, RoutedDelivery):
        return None

    def accept(_command: Any) -> int:
        c = entity._collector("a routed delivery")
        marks = dict(route_marks(entity).marks)
        accepted = 0
        for r in command.events:
            if r.source_seq_nr <= marks.get(r.source_pid, 0):
                continue
            c.routed[len(c.events)] = (r.source_pid, r.source_seq_nr)
            c.events.append(r.event)
            c.destinations.append(())
            c.callbacks.append(None)
            marks[r.source_pid] = r.source_seq_nr
            accepted += 1
        return accepted

    return accept
