from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from journal import ConfigurationError, SerializationError, SerializerRegistry


@dataclasses.dataclass
class ItemAdded:
    item: str
    qty: int


class Model:
    """A pydantic-style model (model_dump / model_validate) without depending on pydantic."""

    def __init__(self, x: int) -> None:
        self.x = x

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        return {"x": self.x}

    @classmethod
    def model_validate(cls, data: dict[str, Any]) -> Model:
        return cls(**data)


def test_json_round_trips() -> None:
    reg = SerializerRegistry()
    for value in ({"a": [1, 2]}, [1, "x"], "s", 3, None, True):
        s = reg.serialize(value)
        assert s.ser_id == 1 and s.manifest == ""
        assert reg.deserialize(s.ser_id, s.manifest, s.payload) == value


def test_dataclass_and_model() -> None:
    reg = SerializerRegistry()
    s = reg.serialize(ItemAdded("apple", 2))
    assert s.manifest.endswith(":ItemAdded")
    assert reg.deserialize(1, s.manifest, s.payload) == {"item": "apple", "qty": 2}
    reg.register_type(ItemAdded)
    assert reg.deserialize(1, s.manifest, s.payload) == ItemAdded("apple", 2)
    reg.register_type(Model)
    m = reg.serialize(Model(7))
    assert reg.deserialize(1, m.manifest, m.payload).x == 7


def test_bytes_pass_through() -> None:
    reg = SerializerRegistry()
    s = reg.serialize(b"\x00\xff")
    assert (s.ser_id, s.payload) == (0, b"\x00\xff")
    assert reg.deserialize(0, "", s.payload) == b"\x00\xff"


def test_user_serializer() -> None:
    class Upper:
        identifier = 42

        def manifest(self, value: Any) -> str:
            return "upper"

        def to_bytes(self, value: Any) -> bytes:
            return str(value).upper().encode()

        def from_bytes(self, payload: bytes, manifest: str) -> Any:
            return payload.decode().lower()

    class Word(str):
        pass

    reg = SerializerRegistry()
    reg.register(Upper(), Word)
    s = reg.serialize(Word("hi"))
    assert (s.ser_id, s.manifest, s.payload) == (42, "upper", b"HI")
    assert reg.deserialize(42, "upper", b"HI") == "hi"
    with pytest.raises(ConfigurationError):
        reg.register(Upper())  # a different instance with a taken id


def test_errors_are_clear() -> None:
    reg = SerializerRegistry()
    with pytest.raises(SerializationError, match="object"):
        reg.serialize(object())
    with pytest.raises(SerializationError, match="no serializer registered with id 99"):
        reg.deserialize(99, "", b"")
    with pytest.raises(SerializationError, match="cannot deserialize"):
        reg.deserialize(1, "", b"{not json")


def test_a_type_registered_under_a_manifest_is_written_with_it() -> None:
    """``register_type(cls, manifest=...)``: the rows it writes carry that manifest (a name the
    JVM's services may share), so they read back as ``cls``, as with a version."""
    reg = SerializerRegistry()
    reg.register_type(ItemAdded, manifest="com.example.ItemAdded")
    s = reg.serialize(ItemAdded("pear", 3))
    assert s.manifest == "com.example.ItemAdded"
    assert reg.deserialize(1, s.manifest, s.payload) == ItemAdded("pear", 3)
