"""Input checks of the slice queries, run before any I/O."""

from __future__ import annotations

from typing import get_args

from ..errors import InvalidArgument, OffsetError
from ..ids import validate_entity_type, validate_slice_range
from ..offsets import NoOffset, SequenceOffset, TimestampOffset
from ..settings import QueryMode


def check_slice_query(
    entity_type: object,
    min_slice: object,
    max_slice: object,
    offset: object,
    mode: object,
    default_mode: QueryMode,
) -> tuple[TimestampOffset | None, QueryMode]:
    """Validate a slice query's arguments; return the offset (None = from the start) and the mode.

    An entity type is "unknown" only when it is not a valid entity type string (not a str,
    contains NUL or ``|``, too long). A valid entity type that has no events yet is not an error:
    current queries return nothing and live queries wait for its first event.
    """
    validate_entity_type(entity_type)
    validate_slice_range(min_slice, max_slice)  # type: ignore[arg-type]
    if mode is None:
        mode = default_mode
    if mode not in get_args(QueryMode):
        raise InvalidArgument(f"mode must be one of {get_args(QueryMode)}, got {mode!r}")
    if offset is None or isinstance(offset, NoOffset):
        return None, mode  # type: ignore[return-value]
    if not isinstance(offset, TimestampOffset):
        hint = (
            f"; a {type(offset).__name__} offset belongs to events_by_persistence_id"
            if isinstance(offset, SequenceOffset)
            else ""
        )
        raise OffsetError(
            f"slice queries take a TimestampOffset (or None / NoOffset), got {type(offset).__name__}: "
            f"{offset!r:.80}{hint}"
        )
    return offset, mode  # type: ignore[return-value]
