"""Entities and a view used by the routing, view and conditional-request tests (importable by
subprocesses too)."""

from __future__ import annotations

from typing import Any

from journal import Entity, View, after_persist


class Order(Entity[list[Any]]):
    """Commands: ("place", item, destinations) persists ``item`` routed there; ("read",)."""

    entity_type = "order"

    def initial_state(self) -> list[Any]:
        return []

    def on_command(self, command: Any) -> Any:
        if command[0] == "place":
            self.persist(command[1], destinations=list(command[2]))
            return after_persist(lambda: len(self.state))
        if command[0] == "place_all":
            self.persist_all(list(command[1]), destinations=list(command[2]))
            return None
        return list(self.state)

    def on_event(self, state: list[Any], event: Any) -> list[Any]:
        return [*state, event]


class Account(Entity[list[Any]]):
    """State: (event, routed_from) pairs. Commands: ("add", x) persists x; ("read",)."""

    entity_type = "account"

    def initial_state(self) -> list[Any]:
        return []

    def on_command(self, command: Any) -> Any:
        if command[0] == "add":
            self.persist(command[1])
            return after_persist(lambda: len(self.state))
        return list(self.state)

    def on_event(self, state: list[Any], event: Any) -> list[Any]:
        src = self.current_event.routed_from
        return [*state, [event, list(src) if src else None]]

    def restore_snapshot(self, snapshot: Any) -> list[Any]:
        return [list(x) for x in snapshot]


class SnapAccount(Account):
    entity_type = "snapaccount"
    snapshot_every = 3


class LazyAccount(Account):
    entity_type = "lazyaccount"
    state_sync = False


class OrderCount(View[dict[str, int]]):
    """Events per order pid (orders, and what was routed to account|a)."""

    view_id = "order-count"
    entity_types = ("order",)
    aggregate_ids = ("account|a",)

    def initial_state(self) -> dict[str, int]:
        return {}

    def on_event(self, state: dict[str, int], event: Any) -> dict[str, int]:
        key = self.current_event.envelope.persistence_id
        return {**state, key: state.get(key, 0) + 1}

    def on_query(self, state: dict[str, int], query: Any) -> Any:
        return dict(state) if query == "all" else state.get(query, 0)


class Trail(View[list[Any]]):
    """Every applied (pid, seq_nr), in order: a double application shows as a repeated pair."""

    view_id = "trail"
    entity_types = ("order",)
    event_types = ()

    def initial_state(self) -> list[Any]:
        return []

    def on_event(self, state: list[Any], event: Any) -> list[Any]:
        env = self.current_event.envelope
        return [*state, [env.persistence_id, env.seq_nr]]

    def on_query(self, state: list[Any], query: Any) -> Any:
        return list(state)

    def restore_snapshot(self, snapshot: Any) -> list[Any]:
        return [list(x) for x in snapshot]
