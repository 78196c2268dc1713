"""The CQL of the package's .cql files, and the pure partition math around it."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from importlib import resources
from itertools import groupby
from typing import TypeVar

from ..errors import ConfigurationError

T = TypeVar("T")

TARGET_PARTITION_SIZE = 500_000
"""Reference default: events per (persistence_id, partition_nr) partition of ``messages``."""

_KEYSPACE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")


def validate_keyspace(name: str) -> str:
    if not _KEYSPACE.match(name or ""):
        raise ConfigurationError(
            f"keyspace {name!r} is not a valid Cassandra identifier (letters, digits, '_', max 48)"
        )
    return name


def _read(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def schema_statements(keyspace: str) -> list[str]:
    """The keyspace and table DDL of ``schema.cql``, one statement each."""
    text = _render(_read("schema.cql"), keyspace)
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]


def statements(keyspace: str, file: str = "statements.cql") -> dict[str, str]:
    """The named statements of a .cql file of the package (``-- name: x`` starts one)."""
    out: dict[str, str] = {}
    current: str | None = None
    lines: list[str] = []
    for line in _read(file).splitlines():
        m = re.match(r"^-- name: (\w+)\s*$", line)
        if m:
            if current:
                out[current] = " ".join(" ".join(lines).split())
            current, lines = m.group(1), []
        elif current and line.strip() and not line.startswith("--"):
            lines.append(line)
    if current:
        out[current] = " ".join(" ".join(lines).split())
    return {k: _render(v, keyspace) for k, v in out.items()}


def _render(text: str, keyspace: str) -> str:
    return text.replace("{keyspace}", validate_keyspace(keyspace))


def partition_nr(seq_nr: int, target_partition_size: int = TARGET_PARTITION_SIZE) -> int:
    """``(seq_nr - 1) // target_partition_size`` (sequence numbers start at 1)."""
    if seq_nr < 1:
        raise ValueError(f"seq_nr must be >= 1, got {seq_nr}")
    return (seq_nr - 1) // target_partition_size


def atomic_partition(first_seq_nr: int, target_partition_size: int = TARGET_PARTITION_SIZE) -> int:
    """An atomic write stays in one partition: the partition of its first event (it may run past
    the target size, as the reference allows)."""
    return partition_nr(first_seq_nr, target_partition_size)


def group_by_partition(items: Sequence[T], key: Callable[[T], int]) -> list[tuple[int, list[T]]]:
    """Consecutive items grouped by partition (one unlogged batch each)."""
    return [(k, list(g)) for k, g in groupby(items, key=key)]

