"""Concurrent versions of one value under vector time (model layer, no I/O).

Replicas may update a value concurrently. :class:`ConcurrentVersions` keeps every version no
other version causally supersedes: an update that happened after some versions replaces them,
an update concurrent with them is kept beside them, an update they already dominate is dropped.
The kept versions are therefore the maximal elements of all updates, whatever the order they
arrived in. The application picks a winner with :meth:`ConcurrentVersions.resolve`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgument
from ..vector_time import VectorTime


@dataclass(frozen=True, slots=True)
class Version:
    """One version of the value: the value, its vector time and who created it (optional)."""

    value: Any
    vector_time: VectorTime
    creator: str = ""

    @property
    def sort_key(self) -> tuple[int, tuple[tuple[str, int], ...], str]:
        return (self.vector_time.total(), tuple(self.vector_time.items()), self.creator)


class ConcurrentVersions:
    """Immutable: :meth:`update` and :meth:`resolve` return a new instance.

    Serialization: the JSON serializer stores it through :meth:`model_dump` and, once
    ``serializers.register_type(ConcurrentVersions)`` ran, reads it back through
    :meth:`model_validate` (values must be JSON-able).
    """

    __slots__ = ("_versions",)

    def __init__(self, versions: Iterable[Version] = ()) -> None:
        kept: list[Version] = []
        for v in versions:
            kept = _add(kept, v)
        self._versions = tuple(sorted(kept, key=lambda v: v.sort_key))

    # -- reading -------------------------------------------------------------------------------
    @property
    def all(self) -> tuple[Version, ...]:
        """The kept versions, oldest first (by vector-time sum, then entries, then creator)."""
        return self._versions

    @property
    def conflict(self) -> bool:
        """More than one version is kept: concurrent updates wait for :meth:`resolve`."""
        return len(self._versions) > 1

    @property
    def vector_time(self) -> VectorTime:
        """The merge of the kept versions' vector times: every update this value has seen."""
        out = VectorTime()
        for v in self._versions:
            out = out.merge(v.vector_time)
        return out

    # -- changing ------------------------------------------------------------------------------
    def update(self, value: Any, vector_time: Mapping[str, int], creator: str = "") -> ConcurrentVersions:
        """Add an update: it replaces the versions it causally follows, sits beside concurrent
        ones, and is ignored if a kept version already has its vector time or a later one."""
        vt = vector_time if isinstance(vector_time, VectorTime) else VectorTime(vector_time)
        return ConcurrentVersions((*self._versions, Version(value, vt, creator)))

    def resolve(self, selected: Mapping[str, int], vector_time: Mapping[str, int] | None = None) -> ConcurrentVersions:
        """Keep only the version whose vector time is ``selected``, stamped with the merge of all
        versions' vector times (and of ``vector_time``, the resolving event's, if given), so it
        causally follows everything it replaced.

        Raises:
            InvalidArgument: no kept version has the vector time ``selected``.
        """
        chosen = next((v for v in self._versions if v.vector_time == selected), None)
        if chosen is None:
            raise InvalidArgument(f"no concurrent version has vector time {dict(selected)!r}")
        merged = self.vector_time.merge(vector_time or {})
        return ConcurrentVersions((Version(chosen.value, merged, chosen.creator),))

    # -- serialization -------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "versions": [
                {"value": v.value, "vector_time": v.vector_time.to_json(), "creator": v.creator} for v in self._versions
            ]
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ConcurrentVersions:
        """Read :meth:`to_json` output back; raises :class:`InvalidArgument` on another shape."""
        try:
            return cls(
                Version(d["value"], VectorTime.from_json(d["vector_time"]), str(d.get("creator", "")))
                for d in data["versions"]
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise InvalidArgument(f"not a serialized ConcurrentVersions: {e!r}") from e

    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        """The JSON serializer's hook (pydantic-style)."""
        return self.to_json()

    @classmethod
    def model_validate(cls, data: Mapping[str, Any]) -> ConcurrentVersions:
        """The JSON serializer's hook for reading back (pydantic-style)."""
        return cls.from_json(data)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ConcurrentVersions):
            return NotImplemented
        return self._versions == other._versions

    def __hash__(self) -> int:
        return hash(tuple((v.vector_time, v.creator) for v in self._versions))

    def __repr__(self) -> str:
        return f"ConcurrentVersions({list(self._versions)!r})"


def _add(kept: list[Version], new: Version) -> list[Version]:
    if any(new.vector_time <= v.vector_time for v in kept):
        return kept  # already seen (or superseded)
    return [v for v in kept if not v.vector_time < new.vector_time] + [new]
