"""Serializers, keyed by (serializer id, manifest).

Stored rows carry ``event_ser_id`` and ``event_ser_manifest``; the registry picks the serializer
that wrote a row to read it back. Built in: bytes pass through (id 0), JSON (id 1) for dicts,
lists, scalars, dataclasses and pydantic-style models (anything with ``model_dump``). Register a
serializer for your own types with :meth:`SerializerRegistry.register`.

Plain values (dicts, lists, tuples, floats and what they hold) are stored only when reading them
back gives an equal value: a set, a tuple, a datetime, a UUID, a Decimal, NaN or infinity, a
non-string dict key or a model inside a dict would come back as something else (a list, a str,
None), so :class:`SerializationError` refuses them at ``persist``, before anything is written
(see docs/journal.md, "What JSON carries"). The stored JSON stays plain JSON, which a JVM service
reading the same tables understands.

Old rows are upgraded here, on every read path: the registry's :class:`~journal.upcasting.Upcasters`
run on the data of a row whose stored manifest (``name#version``) has one (docs/schema-evolution.md).
With a :class:`~journal.codec.PayloadCodec`, event payloads and snapshot states are sealed
(compressed, encrypted) after serializing and opened before deserializing (docs/encryption.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import orjson

from .codec import CODEC_SERIALIZER_ID, Forgotten, KeysInUse, PayloadCodec
from .errors import ConfigurationError, SerializationError, UnknownVersion
from .upcasting import EventSeq, Upcasters, split_version, versioned

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
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_CHECKED = frozenset({dict, list, tuple, float})
"""Plain types whose JSON may read back as something else (what they hold, a tuple, NaN): a
value of these is stored only when reading its JSON back gives an equal value. A str, int or
bool either reads back equal or does not serialize at all."""


def faithful(value: Any, payload: bytes, what: str = "it") -> bytes:
    """``payload`` when reading it back gives ``value``; else SerializationError naming the part
    that would change."""
    if type(value) in _CHECKED and _loads(payload) != value:
        raise SerializationError(f"cannot store {what} as JSON unchanged: {_changed(value)}")
    return payload


def _changed(value: Any, where: str = "") -> str:
    """The first part of ``value`` that JSON would not give back, and what it would become."""
    at = where or "the value"
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return f"{at} is {value!r}, which JSON stores as null (read back as None)"
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str):
                return f"{at} has the key {k!r} ({type(k).__name__}), which JSON stores as a string"
            found = _changed(v, f"{where}[{k!r}]")
            if found:
                return found
        return ""
    if isinstance(value, list | tuple):
        if type(value) is tuple:
            return f"{at} is a tuple, which reads back as a list (use a list)"
        for i, v in enumerate(value):
            found = _changed(v, f"{where}[{i}]")
            if found:
                return found
        return ""
    if type(value) in (str, int, bool, float) or value is None:
        return ""
    try:
        back = f"reads back as a {type(_loads(orjson.dumps(value, default=_to_jsonable))).__name__}"
    except (TypeError, orjson.JSONEncodeError):
        back = "JSON cannot hold"
    return (
        f"{at} is a {type(value).__name__}, which {back}: convert it first (e.g. str(a_uuid), "
        "a_datetime.isoformat(), sorted(a_set)) or make the event a registered type"
    )


class JsonSerializer:
    """JSON for plain data, dataclasses and pydantic-style models.

    The manifest is the event's type name (``module:QualName``) for dataclasses and models, so
    a reader can rebuild the type when it is registered with :meth:`register_type`; plain
    dicts and lists have the empty manifest.
    """

    identifier = JSON_SERIALIZER_ID

    def __init__(self) -> None:
        self._types: dict[str, Callable[[Any], Any]] = {}
        self._manifests: dict[type, str] = {}
        """Types written at a version above 1: their stored manifest (``name#version``)."""
        self._latest: dict[str, int] = {}
        """Registered manifest name -> the highest version registered (newer rows: UnknownVersion)."""

    def register_type(self, cls: type, manifest: str | None = None, version: int = 1) -> None:
        """Rebuild ``cls`` from stored JSON whose manifest is ``manifest`` (default: its type name);
        new rows of ``cls`` are written with that manifest, so they read back as ``cls``.

        ``version`` > 1: ``cls`` is that version of the event; new rows are written with the
        manifest ``name#version`` and older rows are read through the registry's upcasters.
        """
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ConfigurationError(f"version must be an int >= 1, got {version!r}")
        base = manifest or _type_name(cls)
        self._latest[base] = max(version, self._latest.get(base, 0))
        name = versioned(base, version)
        if version > 1 or manifest is not None:
            self._manifests[cls] = name
        validate = getattr(cls, "model_validate", None)
        if callable(validate):
            self._types[name] = validate
        else:
            self._types[name] = lambda data: cls(**data)

    def manifest(self, value: Any) -> str:
        t = type(value)
        if t in _PLAIN or value is None or isinstance(value, dict | list | str | int | float):
            return ""
        return self._manifests.get(t) or _type_name(t)

    def to_bytes(self, value: Any) -> bytes:
        return faithful(value, orjson.dumps(value, default=_to_jsonable))

    def from_bytes(self, payload: bytes, manifest: str) -> Any:
        return self.build(orjson.loads(payload), manifest)

    def decode(self, payload: bytes, manifest: str) -> Any:
        """The data upcasters work on: the parsed JSON."""
        return orjson.loads(payload)

    def build(self, data: Any, manifest: str) -> Any:
        """The value of (upcast) data: an instance of the type registered for ``manifest``, if any."""
        if manifest and manifest in self._types:
            return self._types[manifest](data)
        if manifest and self._latest:
            name, version = split_version(manifest)
            latest = self._latest.get(name)
            if latest is not None and version > latest:
                raise UnknownVersion(
                    f"{manifest!r} is version {version} of {name!r}, which this release registers up to version "
                    f"{latest}: written by a newer release? to read it, register an upcaster from version "
                    f"{version} to {latest} (docs/schema-evolution.md)"
                )
        return data


def dump_json(value: Any) -> bytes:
    """The JSON of a value as the JSON serializer writes it (dataclasses and models as objects),
    without its check that the value reads back unchanged: for data leaving the journal (Spark
    turns an event's data into columns through it)."""
    return orjson.dumps(value, default=_to_jsonable)


_PLAIN = frozenset({dict, list, str, int, float, bool})
MAX_MANIFEST_LENGTH = 255
"""The stored manifest columns' width."""


def dump_plain_json(value: Any) -> bytes:
    """What the JSON serializer stores for a value of :attr:`SerializerRegistry.plain_json_types`;
    raises TypeError (orjson's) or SerializationError (:func:`faithful`) for one it would not
    store unchanged: a caller falls back to :meth:`SerializerRegistry.serialize`, which says why.

    orjson is called bare: options and ``default`` cost a fifth of the call for a small event,
    and every value they would rescue is one that reads back changed."""
    return faithful(value, _dumps(value))


def dump_plain_jsons(values: list[Any]) -> list[bytes]:
    """:func:`dump_plain_json` of each value, serialized and read back in loops in C."""
    payloads = list(map(_dumps, values))
    if list(map(_loads, payloads)) != values:
        raise SerializationError("a value would not read back unchanged")  # the caller's full path names it
    return payloads


_dumps = orjson.dumps
_loads = orjson.loads
_ONE_JSON, _ONE_BYTES, _ONE_MANIFEST = (JSON_SERIALIZER_ID,), (BYTES_SERIALIZER_ID,), ("",)
"""The serializer id and manifest columns of one plain event."""


def stored_plain_json(ser_id: int, manifest: str | None, payload: bytes | None) -> bytes | None:
    """A stored payload as it is, when it is plain JSON (the JSON serializer's, no manifest, so
    neither sealed by the codec nor upcast): what publishers may pass on without decoding it.
    None otherwise."""
    if ser_id != JSON_SERIALIZER_ID or manifest:
        return None
    return payload or None


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class SerializerRegistry:
    """Chooses a serializer for a value (by type) and for a stored row (by serializer id)."""

    def __init__(self) -> None:
        self.json = JsonSerializer()
        self.upcasters = Upcasters()
        """Upcasters of old rows, by stored manifest and version (see :mod:`journal.upcasting`)."""
        self._upcast = self.upcasters.steps  # the read path's one lookup per row
        self.codec: PayloadCodec | None = None
        """Seals event payloads and snapshot states (:meth:`use_codec`); None: stored as serialized."""
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
        if ident == CODEC_SERIALIZER_ID:
            raise ConfigurationError(f"serializer id {ident} is the payload codec's (sealed payloads)")
        existing = self._by_id.get(ident)
        if existing is not None and existing is not serializer:
            raise ConfigurationError(f"serializer id {ident} is already taken by {type(existing).__name__}")
        self._by_id[ident] = serializer
        for t in types if isinstance(types, tuple) else (types,):
            self._by_type[t] = serializer
        self._resolved.clear()
        self._refresh()

    def _refresh(self) -> None:
        """The hot paths' shortcuts. Outside the registry they are off while a codec seals every
        payload (:attr:`plain_json_types` is then empty); :meth:`serialize_events` seals them."""
        self._plain_json = frozenset(
            t for t in _PLAIN if all(self._by_type.get(k, self.json) is self.json for k in t.__mro__)
        )
        bytes_ser = self._by_type.get(bytes)
        self._plain_bytes: type | None = bytes if isinstance(bytes_ser, BytesSerializer) else None

    def use_codec(self, codec: PayloadCodec | None) -> None:
        """Seal event payloads and snapshot states with ``codec`` (the journal sets it from the
        ``codec`` settings); metadata is never sealed."""
        self.codec = codec
        self._refresh()

    def plain_json_reader(self) -> Callable[[bytes], Any]:
        """What :meth:`deserialize` amounts to for a payload of the JSON serializer (whose id no
        other serializer can take) stored without a manifest: parsing alone, as no upcaster can
        be registered without a manifest name. The read path's shortcut, one call per row
        instead of four; a payload it cannot parse goes the general way, which says why."""
        return orjson.loads

    @property
    def keyed(self) -> bool:
        """True when payloads are encrypted: reads and writes load their subjects' keys first."""
        return self.codec is not None and self.codec.encrypts

    async def load_keys(self, rows: Iterable[tuple[str, int]]) -> KeysInUse:
        """Before decoding rows, given as (persistence id, serializer id): load the keys their
        encrypted payloads need (no I/O when they are cached and fresh). Hold the result until
        the rows are decoded: a key held is not evicted from the cache."""
        if self.codec is None:
            return ()
        return await self.codec.load((pid for pid, ser_id in rows if ser_id == CODEC_SERIALIZER_ID), create=False)

    async def load_write_keys(self, pids: Iterable[str]) -> KeysInUse:
        """Before serializing a write: the keys of its persistence ids' subjects (made when
        missing); hold the result until it is serialized. Raises SubjectForgotten for a
        forgotten subject."""
        if self.codec is None:
            return ()
        return await self.codec.load(pids, create=True)

    @property
    def plain_json_types(self) -> frozenset[type]:
        """Types whose values the built-in JSON serializer writes with no manifest (no registered
        serializer claims them): a hot loop may serialize them with :func:`dump_plain_json`.
        Empty while a codec seals payloads."""
        return self._plain_json if self.codec is None else frozenset()

    @property
    def plain_bytes_type(self) -> type | None:
        """``bytes`` when bytes values pass through unchanged (serializer id 0), else None."""
        return self._plain_bytes if self.codec is None else None

    def register_type(self, cls: type, manifest: str | None = None, version: int = 1) -> None:
        """Shortcut: read JSON rows of ``cls`` back as ``cls`` instances (``version``: see
        :meth:`JsonSerializer.register_type`)."""
        self.json.register_type(cls, manifest, version)

    def _for_value(self, value: Any) -> Serializer:
        t = type(value)
        s = self._by_type.get(t) or self._resolved.get(t)
        if s is None:
            s = next((self._by_type[k] for k in t.__mro__ if k in self._by_type), self.json)
            self._resolved[t] = s
        return s

    def serialize(self, value: Any, *, what: str = "event", pid: str | None = None) -> Serialized:
        """Serialize or raise :class:`SerializationError` naming the value's type (also for a
        manifest longer than the stored column's 255 characters). ``pid``: an event payload or
        snapshot state of this persistence id, which the codec (if any) seals."""
        s = self._for_value(value)
        try:
            out = Serialized(s.identifier, s.manifest(value), s.to_bytes(value))
        except SerializationError as e:
            raise e.located(what) from e
        except Exception as e:  # user serializers may raise anything
            detail = (_changed(value) if s is self.json else "") or str(e)
            raise SerializationError(
                f"cannot serialize {what} of type {type(value).__name__} with {type(s).__name__}: {detail}"
            ) from e
        if pid is not None and self.codec is not None:
            out = Serialized(*self.codec.seal(pid, *out))
        if len(out.manifest) > MAX_MANIFEST_LENGTH:
            raise SerializationError(
                f"serializer manifest longer than {MAX_MANIFEST_LENGTH} characters: {out.manifest[:40]!r}..."
            )
        return out

    def serialize_events(
        self, values: Sequence[Any], pids: str | Sequence[str]
    ) -> tuple[Sequence[int], Sequence[str], Sequence[bytes]]:
        """Events as columns: serializer ids, manifests, payloads. ``pids``: the persistence id of
        the call they belong to, or of each event (a codec seals each payload with its subject's
        key). Raises :class:`SerializationError` naming the event (``event 2 of 'cart|1'``).

        The write path's hot loop: plain JSON values and bytes that no registered serializer claims
        skip the lookup and the manifest call (dumped by orjson in one loop in C)."""
        columns = self._plain_columns(values)
        if columns is not None and self.codec is None:
            return columns
        each = [pids] * len(values) if isinstance(pids, str) else pids
        if columns is None:
            pairs = enumerate(zip(values, each, strict=True))
            out = [self.serialize(v, what=f"event {i} of {p!r}", pid=p) for i, (v, p) in pairs]
            return [s.ser_id for s in out], [s.manifest for s in out], [s.payload for s in out]
        sealed = list(map(self.codec.seal, each, *columns))  # type: ignore[union-attr]
        return [s[0] for s in sealed], [s[1] for s in sealed], [s[2] for s in sealed]

    def _plain_columns(self, values: Sequence[Any]) -> tuple[Sequence[int], Sequence[str], Sequence[bytes]] | None:
        """The columns of events that are all plain JSON values (or one of bytes), else None."""
        plain, n = self._plain_json, len(values)
        try:
            if n == 1:
                t = type(values[0])
                if t in plain:
                    return _ONE_JSON, _ONE_MANIFEST, (dump_plain_json(values[0]),)
                if t is self._plain_bytes:
                    return _ONE_BYTES, _ONE_MANIFEST, (values[0],)
            elif set(map(type, values)) <= plain:
                return [JSON_SERIALIZER_ID] * n, [""] * n, dump_plain_jsons(list(values))
        except Exception:  # the general path raises with the full message
            return None
        return None

    def deserialize(
        self, ser_id: int, manifest: str, payload: bytes, *, what: str = "event", pid: str | None = None
    ) -> Any:
        """The value of a stored payload: opened (``pid``: whose it is, for its key), upcast when
        its manifest has an upcaster, built. An encrypted payload of a forgotten subject reads as a
        :class:`~journal.codec.Forgotten` value."""
        s = self._by_id.get(ser_id)
        if s is None:  # sealed by the codec (its id is never registered), or an unknown serializer
            opened = self._opened(ser_id, manifest, payload, what, pid)
            if type(opened) is Forgotten:
                return opened
            s, ser_id, manifest, payload = opened  # type: ignore[misc]
        try:
            if manifest in self._upcast:
                return self._upcasted(s, manifest, payload)
            return s.from_bytes(payload, manifest)
        except SerializationError as e:  # typed (UnknownVersion, an upcaster's): kept so
            raise e.located(f"cannot deserialize {what} (serializer {ser_id}, manifest {manifest!r})") from e
        except Exception as e:
            raise SerializationError(
                f"cannot deserialize {what} (serializer {ser_id}, manifest {manifest!r}): {e}"
            ) from e

    def stored_data(
        self, ser_id: int, manifest: str, payload: bytes, *, what: str = "event", pid: str | None = None
    ) -> list[tuple[str, Any]] | Forgotten:
        """What :meth:`deserialize` builds its value from: the (stored manifest, data) pairs of a
        payload, opened and upcast but not built into registered types (Spark turns the data into
        columns). The data is the serializer's data form (for JSON the parsed JSON), or its value
        for a serializer without one. A forgotten subject's payload reads as Forgotten."""
        opened = self._opened(ser_id, manifest, payload, what, pid)
        if type(opened) is Forgotten:
            return opened
        s, ser_id, manifest, payload = opened  # type: ignore[misc]
        decode = getattr(s, "decode", None)
        try:
            if decode is None:
                parts = self.upcasters.upcast(manifest, payload) if manifest in self._upcast else [(manifest, payload)]
                return [(m, s.from_bytes(d, m)) for m, d in parts]
            data = decode(payload, manifest)
            return self.upcasters.upcast(manifest, data) if manifest in self._upcast else [(manifest, data)]
        except Exception as e:
            raise SerializationError(
                f"cannot deserialize {what} (serializer {ser_id}, manifest {manifest!r}): {e}"
            ) from e

    def _opened(
        self, ser_id: int, manifest: str, payload: bytes, what: str, pid: str | None
    ) -> tuple[Serializer, int, str, bytes] | Forgotten:
        """The serializer of a stored payload and its plain (ser_id, manifest, payload): opened
        when the codec sealed it (Forgotten for a forgotten subject's)."""
        if ser_id == CODEC_SERIALIZER_ID:
            opened = (self.codec or _UNSEALER).open(pid, manifest, payload)
            if type(opened) is Forgotten:
                return opened
            ser_id, manifest, payload = opened  # type: ignore[misc]
        s = self._by_id.get(ser_id)
        if s is None:
            raise SerializationError(f"no serializer registered with id {ser_id} to read {what}")
        return s, ser_id, manifest, payload

    def _upcasted(self, s: Serializer, manifest: str, payload: bytes) -> Any:
        """An old row: its data through the upcasters, then built as what it became."""
        decode, build = getattr(s, "decode", None), getattr(s, "build", None)
        data = decode(payload, manifest) if decode is not None else payload
        parts = self.upcasters.upcast(manifest, data)
        if build is None:  # a serializer without a data form: upcasters return payload bytes
            values = [s.from_bytes(d, m) for m, d in parts]
        else:
            values = [build(d, m) for m, d in parts]
        return values[0] if len(values) == 1 else EventSeq(values)


_UNSEALER = PayloadCodec(None)
"""Opens compressed payloads for a registry without a codec (an encrypted one needs keys)."""
