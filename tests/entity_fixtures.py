"""Entities used by the entity tests (importable by subprocesses too)."""

from __future__ import annotations

import asyncio
from typing import Any

from journal import Entity, after_persist


class Counter(Entity[list[Any]]):
    """State: the list of applied events. Commands are tuples."""

    entity_type = "counter"
    log: list[str] = []  # shared trace of handler calls, per test

    def initial_state(self) -> list[Any]:
        return []

    async def on_command(self, command: Any) -> Any:
        kind = command[0]
        if kind == "add":
            self.persist(command[1], on_persisted=lambda env: Counter.log.append(f"cb {env.seq_nr}"))
            return after_persist(lambda: list(self.state))
        if kind == "add_all":
            self.persist_all(list(command[1]))
            return after_persist(lambda: len(self.state))
        if kind == "read":
            return list(self.state)
        if kind == "seen_then_add":  # reply with the state the handler saw
            seen = len(self.state)
            self.persist(command[1])
            return seen
        if kind == "slow_add":
            await asyncio.sleep(command[2])  # the stall the test asks for (the thing under test)
            self.persist(command[1])
            return len(self.state)
        if kind == "fail":
            self.persist("never")
            raise ValueError("refused")
        if kind == "snapshot":
            self.persist(command[1])
            self.save_snapshot()
            return None
        if kind == "route":
            self.persist(command[1], destinations=command[2])
            return None
        if kind == "unserializable":
            self.persist(object())
            return None
        raise ValueError(f"unknown {command!r}")

    def on_event(self, state: list[Any], event: Any) -> list[Any]:
        Counter.log.append(f"event {event}")
        if event == "poison":
            raise RuntimeError("cannot apply poison")
        if event == "persist_in_handler":
            self.persist("nested")
        return [*state, event]


class LazyCounter(Counter):
    entity_type = "lazy"
    state_sync = False


class SnapCounter(Counter):
    entity_type = "snap"
    snapshot_every = 3

    def restore_snapshot(self, snapshot: Any) -> list[Any]:
        if snapshot == ["bad"]:
            raise ValueError("cannot restore")
        return list(snapshot)


class SkipCounter(Counter):
    entity_type = "skip"
    replay_from_seq_nr = 3


class Booking(Entity[list[Any]]):
    """Stashing and behaviour changes: after ``("reserve", x)`` the entity waits for the
    confirmation command; other commands are stashed meanwhile and handled once confirmed."""

    entity_type = "booking"

    def initial_state(self) -> list[Any]:
        return []

    def on_command(self, command: Any) -> Any:
        kind = command[0]
        if kind == "reserve":
            self.persist(f"requested {command[1]}")
            self.become(self.awaiting_confirmation)
            return after_persist(lambda: list(self.state))
        if kind == "read":
            return list(self.state)
        raise ValueError(f"unknown {command!r}")

    async def awaiting_confirmation(self, command: Any) -> Any:
        kind = command[0]
        if kind == "confirm":
            self.persist(f"confirmed {command[1]}")
            self.unbecome()
            self.unstash_all()
            return after_persist(lambda: list(self.state))
        if kind == "cancel_wait_and_fail":
            self.unbecome()
            raise ValueError("refused: behaviour unchanged")
        if kind == "stash_and_persist":
            self.stash()
            self.persist("never")
        self.stash()
        return None

    def on_event(self, state: list[Any], event: Any) -> list[Any]:
        return [*state, event]


class Tracer(Entity[list[Any]]):
    """Records the metadata of every event its handler applies (``current_event``)."""

    entity_type = "tracer"
    seen: list[Any] = []  # (event, seq_nr, emitter_id, aggregate_id, destinations, replay, db_timestamp, vt)

    def initial_state(self) -> list[Any]:
        return []

    def on_command(self, command: Any) -> Any:
        if command[0] == "read":
            return list(self.state)
        self.persist(command[1], destinations=command[2] if len(command) > 2 else ())
        return after_persist(lambda: list(self.state))

    def on_event(self, state: list[Any], event: Any) -> list[Any]:
        e = self.current_event
        Tracer.seen.append(
            (event, e.seq_nr, e.emitter_id, e.aggregate_id, e.destinations, e.replay, e.db_timestamp, e.vector_time)
        )
        return [*state, event]


class LazyBooking(Booking):
    entity_type = "lazybooking"
    state_sync = False
