"""Entities for the persist_on_event and confirmed-delivery tests (importable by subprocesses)."""

from __future__ import annotations

import os
import signal
from typing import Any

from journal import Entity, after_persist


class Order(Entity[list[str]]):
    """``placed:x`` asks for ``reserved:x`` which asks for ``shipped:x`` (persist_on_event)."""

    entity_type = "order"
    crash_between_writes = False  # a worker sets it: SIGKILL right after placed:x is written

    def initial_state(self) -> list[str]:
        return []

    def on_command(self, command: Any) -> Any:
        if command[0] == "place":
            self.persist(f"placed:{command[1]}")
            return after_persist(lambda: list(self.state))
        if command[0] == "read":
            return list(self.state)
        raise ValueError(f"unknown {command!r}")

    def on_event(self, state: list[str], event: str) -> list[str]:
        kind, _, item = event.partition(":")
        if kind == "placed":
            self.persist_on_event(f"reserved:{item}")
            if Order.crash_between_writes and not self.current_event.replay:
                os.kill(os.getpid(), signal.SIGKILL)  # the trigger is stored, the follow-up not
        elif kind == "reserved":
            self.persist_on_event(f"shipped:{item}", destinations=["shipping|1"])
        return [*state, event]


class Sender(Entity[list[str]]):
    """``send:m`` delivers ``m`` to the destination ``sink`` as ``d-<seq_nr>`` until confirmed."""

    entity_type = "sender"
    redeliver_interval = 0.3

    def initial_state(self) -> list[str]:
        return []

    def on_command(self, command: Any) -> Any:
        kind = command[0]
        if kind == "send":
            self.persist(f"send:{command[1]}")
            return after_persist(lambda: list(self.state))
        if kind == "confirm":
            if command[1] in self.unconfirmed:  # idempotent: a late confirmation writes nothing
                self.persist_confirmation(f"confirmed:{command[1]}", command[1])
            return None
        if kind == "unconfirmed":
            return sorted(self.unconfirmed)
        if kind == "snapshot":
            self.save_snapshot()
            return None
        if kind == "read":
            return list(self.state)
        raise ValueError(f"unknown {command!r}")

    def on_event(self, state: list[str], event: str) -> list[str]:
        kind, _, msg = event.partition(":")
        if kind == "send":
            self.deliver(f"d-{self.current_event.seq_nr}", msg, "sink")
        return [*state, event]
