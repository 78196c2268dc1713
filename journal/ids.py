"""Persistence ids, entity types and slices, computed exactly as the JVM reference does.

A slice is ``abs(javaHashCode(pid) % 1024)``. Java's ``String.hashCode`` runs over UTF-16 code
units with 32-bit wrap-around, and Java's ``%`` keeps the sign of the dividend; matching both
lets a Python service and a JVM service share one journal.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from .errors import InvalidArgument

NUMBER_OF_SLICES = 1024
MAX_PERSISTENCE_ID_LENGTH = 255
ENTITY_TYPE_SEPARATOR = "|"


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 units, int32."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


@functools.lru_cache(maxsize=65536)
def _slice_1024(persistence_id: str) -> int:
    return abs(java_string_hash(persistence_id)) % NUMBER_OF_SLICES


def slices_for(persistence_ids: Iterable[str]) -> list[int]:
    """:func:`slice_for` of each persistence id (1024 slices): the cache called from a loop in C."""
    return list(map(_slice_1024, persistence_ids))


def slice_for(persistence_id: str, number_of_slices: int = NUMBER_OF_SLICES) -> int:
    """The slice (0..1023) of a persistence id, equal to the JVM's ``Persistence.sliceForPersistenceId``."""
    if number_of_slices == NUMBER_OF_SLICES:
        return _slice_1024(persistence_id)
    # Java's % truncates towards zero (sign of the dividend), Python's floors: use math on abs.
    return abs(java_string_hash(persistence_id)) % number_of_slices


def entity_type_of(persistence_id: str) -> str:
    """The entity type: the prefix before the first ``|`` ("" when there is none)."""
    i = persistence_id.find(ENTITY_TYPE_SEPARATOR)
    return persistence_id[:i] if i >= 0 else ""


def entity_id_of(persistence_id: str) -> str:
    """The entity id: the part after the first ``|`` (the whole pid when there is none)."""
    i = persistence_id.find(ENTITY_TYPE_SEPARATOR)
    return persistence_id[i + 1 :] if i >= 0 else persistence_id


def persistence_id_of(entity_type: str, entity_id: str) -> str:
    """Build ``entity_type|entity_id``, refusing a separator inside the entity type."""
    if ENTITY_TYPE_SEPARATOR in entity_type:
        raise InvalidArgument(f"entity type {entity_type!r} must not contain {ENTITY_TYPE_SEPARATOR!r}")
    return f"{entity_type}{ENTITY_TYPE_SEPARATOR}{entity_id}"


def slice_ranges(n: int, number_of_slices: int = NUMBER_OF_SLICES) -> list[tuple[int, int]]:
    """Split the slices into ``n`` equal inclusive ranges; ``n`` must divide 1024."""
    if not isinstance(n, int) or n < 1 or n > number_of_slices or number_of_slices % n:
        raise InvalidArgument(f"number of ranges must divide {number_of_slices}, got {n!r}")
    step = number_of_slices // n
    return [(i * step, (i + 1) * step - 1) for i in range(n)]


def chunk(index: int, count: int, slices: int = NUMBER_OF_SLICES) -> range:
    """The contiguous slices of member ``index`` among ``count`` sharing them (any count, not
    only divisors): how the members of a job split the slices (:mod:`journal.postgres.leases`)."""
    return range(index * slices // count, (index + 1) * slices // count)


def runs(slices: set[int]) -> list[tuple[int, int]]:
    """Contiguous runs ``(lo, hi)`` of a set of slices."""
    out: list[tuple[int, int]] = []
    for s in sorted(slices):
        if out and out[-1][1] == s - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def validate_slice_range(min_slice: int, max_slice: int) -> None:
    """Refuse inverted or out-of-range slice ranges before any I/O."""
    for name, v in (("min_slice", min_slice), ("max_slice", max_slice)):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < NUMBER_OF_SLICES:
            raise InvalidArgument(f"{name} must be an int in 0..{NUMBER_OF_SLICES - 1}, got {v!r}")
    if min_slice > max_slice:
        raise InvalidArgument(f"inverted slice range {min_slice}..{max_slice}")


def validate_persistence_id(persistence_id: object) -> str:
    """Refuse empty, over-long or NUL-carrying persistence ids before any I/O."""
    if not isinstance(persistence_id, str):
        raise InvalidArgument(f"persistence id must be a str, got {type(persistence_id).__name__}")
    if not persistence_id:
        raise InvalidArgument("persistence id must not be empty")
    if "\x00" in persistence_id:
        raise InvalidArgument(f"persistence id must not contain NUL bytes: {persistence_id!r}")
    if len(persistence_id) > MAX_PERSISTENCE_ID_LENGTH:
        raise InvalidArgument(
            f"persistence id is {len(persistence_id)} characters, the limit is "
            f"{MAX_PERSISTENCE_ID_LENGTH}: {persistence_id[:40]!r}..."
        )
    return persistence_id


MAX_NAME_LENGTH = 255
"""Entity types, tags and projection names are stored in columns of 255 characters."""


def validate_name(value: object, what: str, *, allow_empty: bool = False, max_length: int = MAX_NAME_LENGTH) -> str:
    """A name a person typed (entity type, tag, projection): a str, not blank, no NUL, at most
    ``max_length`` characters. ``allow_empty``: the empty string is a valid value (not blank)."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        if allow_empty:
            return value
        raise InvalidArgument(f"{what} must not be empty")
    if not value.strip():
        raise InvalidArgument(f"{what} must not be blank: {value!r}")
    if "\x00" in value:
        raise InvalidArgument(f"{what} must not contain NUL: {value!r}")
    if len(value) > max_length:
        raise InvalidArgument(f"{what} is {len(value)} characters, the limit is {max_length}: {value[:40]!r}...")
    return value


def validate_entity_type(entity_type: object, *, required: bool = False) -> str:
    """Refuse non-string, blank, NUL- or ``|``-carrying or over-long entity types. The empty
    entity type (pids without ``|``) is valid unless ``required`` (a projection, a replicated log)."""
    validate_name(entity_type, "entity type", allow_empty=not required)
    assert isinstance(entity_type, str)
    if ENTITY_TYPE_SEPARATOR in entity_type:
        raise InvalidArgument(
            f"entity type must not contain {ENTITY_TYPE_SEPARATOR!r}: {entity_type!r} "
            f"(a persistence id is entity_type{ENTITY_TYPE_SEPARATOR}entity_id; give only the part before it)"
        )
    return entity_type


MAX_SEQ_NR = 2**63 - 1
"""The highest sequence number the journal stores (the seq_nr column is a signed 64-bit bigint)."""


def validate_seq_nr(name: str, value: object, *, minimum: int = 0, maximum: int = MAX_SEQ_NR) -> int:
    """Refuse non-int, too-small or too-large sequence numbers (before a driver sees them)."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise InvalidArgument(f"{name} must be >= {minimum}, got {value}")
    if value > maximum:
        raise InvalidArgument(f"{name} must be <= {maximum}, got {value}")
    return value


MAX_TAG_LENGTH = MAX_NAME_LENGTH


def validate_tags(tags: object) -> tuple[str, ...]:
    """Tags are non-empty strings without NUL, at most 255 characters; duplicates are dropped."""
    if tags == ():
        return ()
    if isinstance(tags, str):
        raise InvalidArgument("tags must be a collection of strings, not a single string")
    if not isinstance(tags, Iterable):
        raise InvalidArgument(f"tags must be an iterable of str, got {type(tags).__name__}")
    try:
        items: tuple[object, ...] = tuple(tags)
    except TypeError:
        raise InvalidArgument(f"tags must be an iterable of str, got {type(tags).__name__}") from None
    out: list[str] = []
    for t in items:
        validate_name(t, "tag")
        assert isinstance(t, str)
        if t not in out:
            out.append(t)
    return tuple(out)
