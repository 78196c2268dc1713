"""The entity types a journal holds, for messages about one that a person typed (a projection or
a Spark job over an entity type with no events is most often a typo)."""

from __future__ import annotations

from typing import Any

from journal.errors import InvalidArgument
from journal.ids import validate_entity_type


async def known_entity_types(journal: Any) -> dict[str, int]:
    """Event counts per entity type (the backend's ``info``: a scan, so only on the error path)."""
    counts: dict[str, int] = (await journal.backend.info())["events"]
    return counts


def listing(counts: dict[str, int]) -> str:
    """``Cart (120), Order (3)``, or what an empty journal is."""
    return ", ".join(f"{t or '(none)'} ({n})" for t, n in sorted(counts.items())) or "none: the journal is empty"


async def has_events(journal: Any, entity_type: str) -> bool:
    """Whether any event of ``entity_type`` is stored (one page of persistence ids, no scan)."""
    async for _ in journal.current_persistence_ids(entity_type):
        return True
    return False


async def check_entity_type(journal: Any, entity_type: str) -> int:
    """The number of events of ``entity_type``; an unknown type is an error naming the known ones."""
    validate_entity_type(entity_type, required=True)
    counts = await known_entity_types(journal)
    if entity_type not in counts:
        raise InvalidArgument(f"unknown entity type {entity_type!r}: the journal has {listing(counts)}")
    return counts[entity_type]
