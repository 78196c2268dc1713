"""Time-based (version 1) UUIDs: the offsets of events by tag.

Layout is the stdlib :mod:`uuid` v1 layout (60-bit count of 100 ns since 1582-10-15, 14-bit
clock sequence, 48-bit node). Two ways to make one:

* :func:`new_timeuuid` - now, strictly increasing within the process (the tag writer's way);
* :func:`timeuuid_for_event` - deterministic from (db_timestamp, pid, seq_nr), so a resend after
  recovery carries the same UUID and is an idempotent upsert. PostgreSQL builds the same UUID in
  SQL (``journal.postgres.tag_statements``); a test checks both agree.

PostgreSQL compares uuids bytewise (not by time), so ordering uses :func:`sort_key`
(the 60-bit time, then the clock sequence and node bytes).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

from .errors import InvalidArgument

GREGORIAN_OFFSET = 0x01B21DD213814000
"""100 ns intervals between 1582-10-15 and 1970-01-01."""

_MAX_TIME = (1 << 60) - 1
_lock = threading.Lock()
_last = 0
_NODE = int.from_bytes(os.urandom(6), "big") | 0x010000000000  # multicast bit: not a MAC
_CLOCK_SEQ = int.from_bytes(os.urandom(2), "big") & 0x3FFF


def _build(t: int, clock_seq: int, node: int) -> uuid.UUID:
    if not 0 <= t <= _MAX_TIME:
        raise InvalidArgument(f"timestamp out of the TimeUUID range: {t}")
    return uuid.UUID(int=_time_bits(t) | _low_bits(clock_seq, node))


def _time_bits(t: int) -> int:
    """The high 64 bits of a v1 UUID of time ``t`` (time_low, time_mid, version and time_hi)."""
    return ((t & 0xFFFFFFFF) << 96) | (((t >> 32) & 0xFFFF) << 80) | ((((t >> 48) & 0x0FFF) | 0x1000) << 64)


def _low_bits(clock_seq: int, node: int) -> int:
    """The low 64 bits of a v1 UUID: the RFC 4122 variant, the clock sequence and the node."""
    return ((((clock_seq >> 8) & 0x3F) | 0x80) << 56) | ((clock_seq & 0xFF) << 48) | (node & 0xFFFFFFFFFFFF)


_OWN_LOW_BITS = _low_bits(_CLOCK_SEQ, _NODE)


def ticks_of_micros(unix_micros: int) -> int:
    return unix_micros * 10 + GREGORIAN_OFFSET


def new_timeuuid(now_ns: int | None = None) -> uuid.UUID:
    """A v1 UUID for now, strictly greater in time than any made before in this process."""
    return new_timeuuids(1, now_ns)[0]


def new_timeuuids(n: int, now_ns: int | None = None) -> list[uuid.UUID]:
    """``n`` v1 UUIDs for now, in increasing time, each strictly greater in time than any made
    before in this process (the events of one write: the clock is read once)."""
    global _last
    t = ((time.time_ns() if now_ns is None else now_ns) // 100) + GREGORIAN_OFFSET
    with _lock:
        if t <= _last:
            t = _last + 1
        _last = t + n - 1
    if _last > _MAX_TIME:
        raise InvalidArgument(f"timestamp out of the TimeUUID range: {_last}")
    return [uuid.UUID(int=_time_bits(x) | _OWN_LOW_BITS) for x in range(t, t + n)]


def timeuuid_for_event(db_timestamp: datetime, persistence_id: str, seq_nr: int) -> uuid.UUID:
    """Deterministic v1 UUID of a stored event.

    Time = db_timestamp (microseconds). The 62 bits of clock sequence and node hold
    ``(seq_nr mod 2**30) << 32 | md5(pid)[:32 bits]``: the events of one call share a timestamp,
    and this keeps them in seq_nr order (bytewise, as PostgreSQL and :func:`sort_key` compare)
    while events of other pids at the same microsecond get other UUIDs.
    """
    h = int(hashlib.md5(persistence_id.encode()).hexdigest()[:8], 16)
    v = ((seq_nr % (1 << 30)) << 32) | h
    return _build(ticks_of_micros(micros_of(db_timestamp)), v >> 48, v & 0xFFFFFFFFFFFF)


def micros_of(ts: datetime) -> int:
    """Microseconds since the Unix epoch of an aware datetime (exact integer arithmetic)."""
    d = ts.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


def ticks(u: uuid.UUID) -> int:
    """The 60-bit timestamp of a v1 UUID (100 ns since 1582-10-15)."""
    if u.version != 1:
        raise InvalidArgument(f"not a time-based (v1) UUID: {u}")
    return u.time


def unix_millis(u: uuid.UUID) -> int:
    return (ticks(u) - GREGORIAN_OFFSET) // 10_000


def datetime_of(u: uuid.UUID) -> datetime:
    """The UTC time of a v1 UUID, to the microsecond."""
    micros = (ticks(u) - GREGORIAN_OFFSET) // 10
    return _EPOCH + timedelta(microseconds=micros)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def min_timeuuid(unix_ms: int) -> uuid.UUID:
    """The lowest v1 UUID at a millisecond (by :func:`sort_key`): a lower range bound."""
    return _build(ticks_of_micros(unix_ms * 1000), 0, 0)


def max_timeuuid(unix_ms: int) -> uuid.UUID:
    """The highest v1 UUID inside a millisecond: an upper range bound."""
    return _build(ticks_of_micros(unix_ms * 1000) + 9_999, 0x3FFF, 0xFFFFFFFFFFFF)


def sort_key(u: uuid.UUID) -> tuple[int, bytes]:
    """Total order of TimeUUIDs: time first, then clock sequence and node bytes."""
    return (ticks(u), u.bytes[8:])
