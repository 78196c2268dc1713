"""Schema evolution: upcasters registered per manifest and version (issue 26).

The version travels in the stored manifest as a suffix, the convention of Akka's Jackson
serializer: ``module:Name`` is version 1, ``module:Name#3`` version 3. The column stays a plain
string, so a JVM reader sees the manifest it would write itself.

An upcaster turns the *data* of an old row (for the JSON serializer: the parsed JSON, before a
registered type is built from it) into the data of the next version, optionally under another
manifest (a rename). A split turns one old event into several (manifest, data) pairs. Chains run
until no upcaster is registered for the (manifest, version) reached. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import ConfigurationError, SerializationError

MAX_CHAIN = 1000
"""Upcasting steps of one row before the chain is taken for a loop."""


def split_version(manifest: str) -> tuple[str, int]:
    """``"m#3"`` -> ``("m", 3)``; a manifest without a ``#N`` suffix is version 1."""
    name, sep, v = manifest.rpartition("#")
    if sep and v.isdigit() and name:
        return name, int(v)
    return manifest, 1


def versioned(name: str, version: int) -> str:
    """The stored manifest of ``name`` at ``version`` (no suffix for version 1)."""
    return name if version == 1 else f"{name}#{version}"


class StoredManifest(NamedTuple):
    """One (kind, serializer, manifest name, version) of the stored rows, with its row count, and
    whether the registry has an upcaster for it (``journal manifests``)."""

    kind: str
    ser_id: int
    name: str
    version: int
    rows: int
    upcast: bool
    sealed: str = ""
    """How the payloads are stored: "" as serialized; flags of the codec: ``e`` encrypted,
    ``z`` compressed (``ser_id`` and ``name`` are then those under the seal)."""


class EventSeq(tuple[Any, ...]):
    """Several events read from one stored row (an upcaster split it): they share the row's
    sequence number and offset. Entities apply each in order; projection handlers see this
    tuple as the envelope's ``event`` (Akka's ``EventSeq`` from an event adapter)."""

    __slots__ = ()


def events_of(value: Any) -> tuple[Any, ...]:
    """The events one stored row reads as: the parts of an :class:`EventSeq`, else the value."""
    return value if type(value) is EventSeq else (value,)


@dataclass(frozen=True)
class _Step:
    fn: Callable[[Any], Any]
    to: str | None
    """The stored manifest (with its version) the result has; None: a split (fn returns pairs)."""


class Upcasters:
    """The upcasters of one serializer registry, by stored manifest."""

    def __init__(self) -> None:
        self.steps: dict[str, _Step] = {}
        """Stored manifest (with its version) -> its step; read-only outside this class (the
        registry's read path tests membership in it, a dict lookup per row)."""

    def __bool__(self) -> bool:
        return bool(self.steps)

    def add(
        self, manifest: str, version: int, fn: Callable[[Any], Any], *, to: str | None = None,
        to_version: int | None = None,
    ) -> None:  # fmt: skip
        """Upgrade rows of ``manifest`` at ``version`` with ``fn(data) -> data``, to ``to`` (default:
        the same manifest) at ``to_version`` (default: ``version + 1``)."""
        target = versioned(to or manifest, to_version if to_version is not None else version + 1)
        self._put(manifest, version, _Step(fn, target))

    def rename(self, old: str, new: str, *, version: int = 1, to_version: int = 1) -> None:
        """Rows stored as ``old`` (at ``version``) are read as ``new`` (at ``to_version``), data unchanged."""
        self._put(old, version, _Step(_same, versioned(new, to_version)))

    def split(self, manifest: str, version: int, fn: Callable[[Any], Sequence[tuple[str, Any]]]) -> None:
        """Rows of ``manifest`` at ``version`` become several events: ``fn(data)`` returns
        ``[(stored manifest, data), ...]`` (each manifest may carry its ``#N``; each is upcast
        further if an upcaster is registered for it)."""
        self._put(manifest, version, _Step(fn, None))

    def include(self, other: Upcasters) -> None:
        """Add the upcasters of ``other`` (``hooks.upcasters``); one already here is kept, and a
        different one for the same manifest and version is refused."""
        for key, step in other.steps.items():
            mine = self.steps.get(key)
            if mine is not None and mine is not step:
                raise ConfigurationError(f"an upcaster for {key!r} is already registered")
            self.steps[key] = step

    def _put(self, manifest: str, version: int, step: _Step) -> None:
        if not manifest or "#" in manifest:
            raise ConfigurationError(f"upcasters need a manifest name without '#N', got {manifest!r}")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ConfigurationError(f"upcaster version must be an int >= 1, got {version!r}")
        key = versioned(manifest, version)
        if key in self.steps:
            raise ConfigurationError(f"an upcaster for {key!r} is already registered")
        self.steps[key] = step

    def upcast(self, manifest: str, data: Any) -> list[tuple[str, Any]]:
        """The (stored manifest, data) pairs an old row reads as (one, unless a split ran)."""
        out: list[tuple[str, Any]] = []
        todo = [(manifest, data)]
        steps = 0
        while todo:
            m, d = todo.pop()
            step = self.steps.get(m)
            if step is None:
                out.append((m, d))
                continue
            steps += 1
            if steps > MAX_CHAIN:
                raise SerializationError(f"upcasting {manifest!r} did not end after {MAX_CHAIN} steps (a loop?)")
            try:
                if step.to is not None:
                    todo.append((step.to, step.fn(d)))
                else:
                    parts = list(step.fn(d))
                    todo.extend(reversed(parts))  # depth first, in order
            except Exception as e:  # the user's function: named, with its error
                target = f"to {step.to!r}" if step.to is not None else "(a split)"
                raise SerializationError(
                    f"upcaster {_name_of(step.fn)} of {m!r} {target} raised {type(e).__name__}: {e}"
                ) from e
        return out

    def registered(self) -> list[str]:
        """The stored manifests that have an upcaster (for ``journal manifests``)."""
        return sorted(self.steps)


def _same(data: Any) -> Any:
    return data


def _name_of(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of a function (a lambda says where it was defined)."""
    code = getattr(fn, "__code__", None)
    name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__name__)}"
    if code is not None and "<lambda>" in name:
        name += f" ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"
    return name
