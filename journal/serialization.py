"""Serializers, keyed by (serializer id, manifest).

Stored rows carry ``event_ser_id`` and ``event_ser_manifest``; the registry picks the serializer
that wrote a row to read it back. Built in: bytes pass through (id 0), JSON (id 1) for dicts,
lists, scalars, dataclasses and pydantic-style models (anything with ``model_dump``). Register a
serializer for your own types with :meth:`SerializerRegistry.register`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import orjson

from .errors import ConfigurationError, SerializationError

BYTES_SERIALIZER_ID = 0
JSON_SERIALIZER_ID = 1


class Serialized(NamedTuple):
    """A serialized payload and how to read it back."""

    ser_id: int
    manifest: str
    payload: bytes


@runtime_checkable
class Serializer(Protocol):
    """Turns values into bytes and back. ``identifier`` is stored with every row it writes."""

    identifier: int

    def manifest(self, value: Any) -> str: ...

    def to_bytes(self, value: Any) -> bytes: ...

    def from_bytes(self, payload: bytes, manifest: str) -> Any: ...


class BytesSerializer:
    """bytes pass through untouched."""

    identifier = BYTES_SERIALIZER_ID

    def manifest(self, value: Any) -> str:
        return ""

    def to_bytes(self, value: Any) -> bytes:
        return bytes(value)

    def from_bytes(self, payload: bytes, manifest: str) -> Any:
        return bytes(payload)


def _to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class JsonSerializer:
    """JSON for plain data, dataclasses and pydantic-style models.

    The manifest is the event's type name (``module:QualName``) for dataclasses and models, so
    a reader can rebuild the type when it is registered with :meth:`register_type`; plain
    dicts and lists have the empty manifest.
    """

    identifier = JSON_SERIALIZER_ID

    def __init__(self) -> None:
        self._types: dict[str, Callable[[Any], Any]] = {}

    def register_type(self, cls: type, manifest: str | None = None) -> None:
        """Rebuild ``cls`` from stored JSON whose manifest is ``manifest`` (default: its type name)."""
        name = manifest or _type_name(cls)
        validate = getattr(cls, "model_validate", None)
        if callable(validate):
            self._types[name] = validate
        else:
            self._types[name] = lambda data: cls(**data)

    def manifest(self, value: Any) -> str:
        t = type(value)
        if t in _PLAIN or value is None or isinstance(value, dict | list | str | int | float):
            return ""
        return _type_name(t)

    def to_bytes(self, value: Any) -> bytes:
        return orjson.dumps(value, default=_to_jsonable, option=_OPTS)

    def from_bytes(self, payload: bytes, manifest: str) -> Any:
        data = orjson.loads(payload)
        if manifest and manifest in self._types:
            return self._types[manifest](data)
        return data


_PLAIN = frozenset({dict, list, str, int, float, bool})
_OPTS = orjson.OPT_NON_STR_KEYS
MAX_MANIFEST_LENGTH = 255
"""The stored manifest columns' width."""


def dump_plain_json(value: Any) -> bytes:
    """What the JSON serializer stores for a value of :attr:`SerializerRegistry.plain_json_types`
    (raises what orjson raises: a caller falls back to :meth:`SerializerRegistry.serialize`).

    orjson is called bare first: its options and ``default`` change nothing for a value it
    serializes without them (they only rescue one it would refuse), and parsing them costs a
    fifth of the call for a small event.
    """
    try:
        return _dumps(value)
    except TypeError:
        return orjson.dumps(value, default=_to_jsonable, option=_OPTS)


def dump_plain_jsons(values: list[Any]) -> list[bytes]:
    """:func:`dump_plain_json` of each value, in one loop in C when none needs the fallback."""
    try:
        return list(map(_dumps, values))
    except TypeError:
        return list(map(dump_plain_json, values))


_dumps = orjson.dumps
_ONE_JSON, _ONE_BYTES, _ONE_MANIFEST = (JSON_SERIALIZER_ID,), (BYTES_SERIALIZER_ID,), ("",)
"""The serializer id and manifest columns of one plain event."""


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class SerializerRegistry:
    """Chooses a serializer for a value (by type) and for a stored row (by serializer id)."""

    def __init__(self) -> None:
        self.json = JsonSerializer()
        self._by_id: dict[int, Serializer] = {}
        self._by_type: dict[type, Serializer] = {}
        self._resolved: dict[type, Serializer] = {}
        self.register(BytesSerializer(), (bytes, bytearray, memoryview))
        self.register(self.json, ())

    def register(self, serializer: Serializer, types: tuple[type, ...] | type = ()) -> None:
        """Use ``serializer`` for values of ``types`` and for rows with its identifier."""
        ident = getattr(serializer, "identifier", None)
        if not isinstance(ident, int) or isinstance(ident, bool):
            raise ConfigurationError(f"serializer {serializer!r} needs an int identifier")
        existing = self._by_id.get(ident)
        if existing is not None and existing is not serializer:
            raise ConfigurationError(
                f"serializer id {ident} is already taken by {type(existing).__name__}"
            )
        self._by_id[ident] = serializer
        for t in types if isinstance(types, tuple) else (types,):
            self._by_type[t] = serializer
        self._resolved.clear()
        self._plain_json = frozenset(
            t for t in _PLAIN if all(self._by_type.get(k, self.json) is self.json for k in t.__mro__)
        )
        bytes_ser = self._by_type.get(bytes)
        self._plain_bytes: type | None = bytes if isinstance(bytes_ser, BytesSerializer) else None

    @property
    def plain_json_types(self) -> frozenset[type]:
        """Types whose values the built-in JSON serializer writes with no manifest (no registered
        serializer claims them): a hot loop may serialize them with :func:`dump_plain_json`."""
        return self._plain_json

    @property
    def plain_bytes_type(self) -> type | None:
        """``bytes`` when bytes values pass through unchanged (serializer id 0), else None."""
        return self._plain_bytes

    def register_type(self, cls: type, manifest: str | None = None) -> None:
        """Shortcut: read JSON rows of ``cls`` back as ``cls`` instances."""
        self.json.register_type(cls, manifest)

    def _for_value(self, value: Any) -> Serializer:
        t = type(value)
        s = self._by_type.get(t) or self._resolved.get(t)
        if s is None:
            s = next((self._by_type[k] for k in t.__mro__ if k in self._by_type), self.json)
            self._resolved[t] = s
        return s

    def serialize(self, value: Any, *, what: str = "event") -> Serialized:
        """Serialize or raise :class:`SerializationError` naming the value's type (also for a
        manifest longer than the stored column's 255 characters)."""
        s = self._for_value(value)
        try:
            out = Serialized(s.identifier, s.manifest(value), s.to_bytes(value))
        except SerializationError:
            raise
        except Exception as e:  # user serializers may raise anything
            raise SerializationError(
                f"cannot serialize {what} of type {type(value).__name__} "
                f"with {type(s).__name__}: {e}"
            ) from e
        if len(out.manifest) > MAX_MANIFEST_LENGTH:
            raise SerializationError(
                f"serializer manifest longer than {MAX_MANIFEST_LENGTH} characters: {out.manifest[:40]!r}..."
            )
        return out

    def serialize_events(
        self, values: Sequence[Any], pid: str
    ) -> tuple[Sequence[int], Sequence[str], Sequence[bytes]]:
        """The events of one call to ``pid`` as columns: serializer ids, manifests, payloads.

        The write path's hot loop: plain JSON values that no registered serializer claims are
        dumped by orjson in one loop in C (no lookup, no manifest call). Raises
        :class:`SerializationError` naming the event (``event 2 of 'cart|1'``)."""
        plain, raw = self._plain_json, self._plain_bytes
        n = len(values)
        try:
            if n == 1:
                t = type(values[0])
                if t in plain:
                    return _ONE_JSON, _ONE_MANIFEST, (dump_plain_json(values[0]),)
                if t is raw:
                    return _ONE_BYTES, _ONE_MANIFEST, (values[0],)
            elif set(map(type, values)) <= plain:
                return [JSON_SERIALIZER_ID] * n, [""] * n, dump_plain_jsons(list(values))
        except Exception:  # the general path below raises with the full message
            pass
        out = [self.serialize(v, what=f"event {i} of {pid!r}") for i, v in enumerate(values)]
        return [s.ser_id for s in out], [s.manifest for s in out], [s.payload for s in out]

    def deserialize(self, ser_id: int, manifest: str, payload: bytes, *, what: str = "event") -> Any:
        s = self._by_id.get(ser_id)
        if s is None:
            raise SerializationError(f"no serializer registered with id {ser_id} to read {what}")
        try:
            return s.from_bytes(payload, manifest)
        except Exception as e:
            raise SerializationError(
                f"cannot deserialize {what} (serializer {ser_id}, manifest {manifest!r}): {e}"
            ) from e
