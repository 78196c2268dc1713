"""Events of the schema-evolution tests: today's classes, the classes an earlier release wrote
(same module and name, other fields), and the registries of both (importable by the CLI test)."""

from __future__ import annotations

from dataclasses import dataclass, make_dataclass
from typing import Any

from journal import Entity, SerializerRegistry

M = __name__
PLACED, ITEM_ADDED, LINE_ADDED = f"{M}:Placed", f"{M}:ItemAdded", f"{M}:LineAdded"
ADDRESS, STREET, CITY = f"{M}:AddressChanged", f"{M}:StreetChanged", f"{M}:CityChanged"


@dataclass
class Placed:
    """Version 2: the amount in cents, with its currency (version 1 had ``amount``, a float)."""

    order: str
    cents: int
    currency: str


@dataclass
class LineAdded:
    """Was ``ItemAdded`` (renamed)."""

    order: str
    sku: str


@dataclass
class StreetChanged:
    order: str
    street: str


@dataclass
class CityChanged:
    order: str
    city: str


def _old(name: str, fields: list[tuple[str, type]]) -> type:
    cls = make_dataclass(name, fields)
    cls.__module__, cls.__qualname__ = M, name  # the earlier release's class had this very name
    return cls


OldPlaced = _old("Placed", [("order", str), ("amount", float)])
OldItemAdded = _old("ItemAdded", [("order", str), ("sku", str)])
OldAddressChanged = _old("AddressChanged", [("order", str), ("street", str), ("city", str)])
"""``AddressChanged`` was split into ``StreetChanged`` and ``CityChanged``."""


def old_registry() -> SerializerRegistry:
    r = SerializerRegistry()
    for cls in (OldPlaced, OldItemAdded, OldAddressChanged):
        r.register_type(cls)
    return r


def registry() -> SerializerRegistry:
    """Today's: Placed at version 2 with an upcaster from 1, a rename, and a split."""
    r = SerializerRegistry()
    r.register_type(Placed, version=2)
    r.upcasters.add(PLACED, 1, lambda d: {"order": d["order"], "cents": round(d["amount"] * 100), "currency": "EUR"})
    r.register_type(LineAdded)
    r.upcasters.rename(ITEM_ADDED, LINE_ADDED)
    r.register_type(StreetChanged)
    r.register_type(CityChanged)
    r.upcasters.split(
        ADDRESS, 1, lambda d: [(STREET, {"order": d["order"], "street": d["street"]}),
                               (CITY, {"order": d["order"], "city": d["city"]})]
    )  # fmt: skip
    return r


def old_events(order: str) -> list[Any]:
    return [OldPlaced(order, 12.5), OldItemAdded(order, "sku-1"), OldAddressChanged(order, "Main St 1", "Ghent")]


class Order(Entity[list[Any]]):
    """State: every event it applied (so a test sees what recovery read)."""

    entity_type = "Order"

    def initial_state(self) -> list[Any]:
        return []

    async def on_command(self, command: Any) -> Any:
        return list(self.state)

    def on_event(self, state: list[Any], event: Any) -> list[Any]:
        return [*state, event]

    def restore_snapshot(self, snapshot: Any) -> list[Any]:
        return [snapshot]  # the tests snapshot the first event (an old Placed) at seq_nr 1
