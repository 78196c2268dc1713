"""Time buckets: the tag view is partitioned by (tag, bucket), a bucket being a UTC time range.

``bucket = floor(unix_millis / size_millis) * size_millis``; the stored ``timebucket`` is the
bucket's start in milliseconds. The size (Day, Hour or Minute) cannot change once tagged data
exists (the query would look in the wrong partitions).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Literal

from .errors import ConfigurationError
from .timeuuid import unix_millis

BucketSize = Literal["Day", "Hour", "Minute"]

BUCKET_MILLIS: dict[str, int] = {"Day": 86_400_000, "Hour": 3_600_000, "Minute": 60_000}


def bucket_millis(size: str) -> int:
    try:
        return BUCKET_MILLIS[size]
    except KeyError:
        raise ConfigurationError(f"tag bucket size must be one of Day, Hour, Minute; got {size!r}") from None


def bucket_of_millis(ms: int, size: str) -> int:
    step = bucket_millis(size)
    return (ms // step) * step


def bucket_of(u: uuid.UUID, size: str) -> int:
    """The bucket (start millis) a TimeUUID falls in."""
    return bucket_of_millis(unix_millis(u), size)


def next_bucket(bucket: int, size: str) -> int:
    return bucket + bucket_millis(size)


def previous_bucket(bucket: int, size: str) -> int:
    return bucket - bucket_millis(size)


def parse_first_bucket(text: str, size: str) -> int:
    """``"20151120T00:00"`` (UTC, the reference's format) -> the bucket start in millis."""
    try:
        dt = datetime.strptime(text, "%Y%m%dT%H:%M").replace(tzinfo=UTC)
    except ValueError:
        raise ConfigurationError(f"first_time_bucket must look like 20151120T00:00 (UTC), got {text!r}") from None
    return bucket_of_millis(int(dt.timestamp() * 1000), size)


def bucket_end(bucket: int, size: str) -> int:
    """First millisecond after the bucket."""
    return bucket + bucket_millis(size)
