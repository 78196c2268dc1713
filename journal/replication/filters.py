"""Replication filters (model layer): which events a source sends, composable with ``&``, ``|``, ``~``.

Filters run at the source, on each read. A filtered event is skipped on that link, not
delayed: the read's position moves past it. In a mesh the target still gets it, exactly once,
if it arrives by another path: a target drops an event only when it has stored it (by its
identity), never because its version vector covers it (see ``Replicator.step``).
Location-private events (by tag) are the common case: no link sends them, so they never leave
their location.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..replicated import ReplicatedEvent


class ReplicationFilter:
    """A predicate over :class:`ReplicatedEvent`: True means "replicate"."""

    __slots__ = ("_predicate", "name")

    def __init__(self, predicate: Callable[[ReplicatedEvent], bool], name: str = "filter") -> None:
        self._predicate = predicate
        self.name = name

    def __call__(self, event: ReplicatedEvent) -> bool:
        return self._predicate(event)

    def __and__(self, other: ReplicationFilter) -> ReplicationFilter:
        return ReplicationFilter(lambda e: self(e) and other(e), f"({self.name} and {other.name})")

    def __or__(self, other: ReplicationFilter) -> ReplicationFilter:
        return ReplicationFilter(lambda e: self(e) or other(e), f"({self.name} or {other.name})")

    def __invert__(self) -> ReplicationFilter:
        return ReplicationFilter(lambda e: not self(e), f"not {self.name}")

    def __repr__(self) -> str:
        return f"ReplicationFilter({self.name})"


def tagged(*tags: str) -> ReplicationFilter:
    """Events carrying any of ``tags``."""
    wanted = frozenset(tags)
    return ReplicationFilter(lambda e: not wanted.isdisjoint(e.tags), f"tagged{sorted(wanted)}")


def persistence_ids(*pids: str) -> ReplicationFilter:
    """Events of these entities (Eventuate's aggregate-id filter)."""
    wanted = frozenset(pids)
    return ReplicationFilter(lambda e: e.persistence_id in wanted, f"pids{sorted(wanted)}")


def not_private(*private_tags: str) -> ReplicationFilter:
    """Everything except events tagged with one of ``private_tags`` (location-private events)."""
    return ~tagged(*private_tags)


@dataclass(frozen=True)
class EndpointFilters:
    """Filters of one endpoint: per source log name and per target location; both must pass."""

    source_logs: Mapping[str, ReplicationFilter] = field(default_factory=dict)
    target_locations: Mapping[str, ReplicationFilter] = field(default_factory=dict)
    all_logs: ReplicationFilter | None = None

    def for_read(self, log_name: str, target_location: str) -> ReplicationFilter | None:
        found = [
            f
            for f in (self.all_logs, self.source_logs.get(log_name), self.target_locations.get(target_location))
            if f is not None
        ]
        if not found:
            return None
        combined = found[0]
        for f in found[1:]:
            combined = combined & f
        return combined
