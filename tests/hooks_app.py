"""An application's hooks, named by import path in the hook tests (``tests.hooks_app:...``):
customer-level subjects, a registry with a version-2 event type and the upcaster of its
version-1 rows, and handlers that refuse anything that was not upcast."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from journal import EventEnvelope, SerializerRegistry
from journal.upcasting import Upcasters

CREATE = "CREATE TABLE IF NOT EXISTS hooks_projected (pid TEXT, seq BIGINT, items INT, PRIMARY KEY (pid, seq))"
NOT_A_REGISTRY = 42


@dataclass
class PlacedV1:
    """What an old release wrote (stored as ``tests.hooks_app:PlacedV1``, version 1)."""

    customer: str
    quantity: int
    note: str = ""


@dataclass
class Placed:
    """Version 2 (``shop:Placed#2``): ``quantity`` is now ``items``."""

    customer: str
    items: int
    note: str = ""


def customer(pid: str) -> str:
    """``Yrs|ann-1`` -> ``YrsCust|ann``: one key per customer, for all of her orders."""
    entity, _, ident = pid.partition("|")
    return f"{entity}Cust|{ident.partition('-')[0]}"


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    return {"customer": data["customer"], "items": data["quantity"], "note": data.get("note", "")}


UPCASTERS = Upcasters()
UPCASTERS.add("tests.hooks_app:PlacedV1", 1, _v1_to_v2, to="shop:Placed", to_version=2)


def registry() -> SerializerRegistry:
    r = SerializerRegistry()
    r.register_type(Placed, "shop:Placed", version=2)
    return r


async def project(conn: Any, envs: Sequence[EventEnvelope]) -> None:
    """Needs upcast events (a Placed); fails on a note saying poison (a handler's bug)."""
    for e in envs:
        if not isinstance(e.event, Placed):
            raise TypeError(f"{e.persistence_id} #{e.seq_nr} is a {type(e.event).__name__}, not an upcast Placed")
        if e.event.note == "poison":
            raise ValueError(f"cannot handle {e.persistence_id} #{e.seq_nr}")
    await _insert(conn, envs)


async def project_fixed(conn: Any, envs: Sequence[EventEnvelope]) -> None:
    for e in envs:
        if not isinstance(e.event, Placed):
            raise TypeError(f"{e.persistence_id} #{e.seq_nr} is a {type(e.event).__name__}, not an upcast Placed")
    await _insert(conn, envs)


async def _insert(conn: Any, envs: Sequence[EventEnvelope]) -> None:
    await conn.executemany(
        "INSERT INTO hooks_projected VALUES ($1, $2, $3)", [(e.persistence_id, e.seq_nr, e.event.items) for e in envs]
    )
