"""Example: one entity written at two locations at once, converging everywhere (docs/replication.md).

Two locations = two databases; each has a replication endpoint (in this process, on free
127.0.0.1 ports). Both write the same register while they are not connected yet, so the two
writes are concurrent; once the endpoints replicate, both locations compute the same state.

Run: ``python examples/replicated_register.py DSN_A DSN_B`` (two migrated, empty databases).
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Sequence
from typing import Any

from journal import JournalSettings, open_journal
from journal.replication.config import EndpointConfig
from journal.replication.conflicts import Versioned
from journal.replication.endpoint import ReplicationEndpoint
from journal.replication.entity import ReplicatedEntities, ReplicatedEntity, ReplicatedState


class Register(ReplicatedEntity[dict[str, Any]]):
    entity_type = "Order"

    def initial_state(self) -> dict[str, Any]:
        return {"value": None}

    def on_event(self, state: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
        return {"value": event["v"]}

    # optional conflict hook; the default applies the event (last writer wins)
    def on_concurrent(
        self, state: dict[str, Any], event: Versioned, concurrent_with: Sequence[Versioned]
    ) -> dict[str, Any]:
        return {"value": max(event.event["v"], state["value"] or "")}


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def main(dsn_a: str, dsn_b: str) -> tuple[ReplicatedState[dict[str, Any]], ReplicatedState[dict[str, Any]]]:
    # 1. each location writes the register on its own (its endpoint is not running yet)
    for dsn, value in ((dsn_a, "written at A"), (dsn_b, "written at B")):
        async with open_journal(dsn, settings=JournalSettings.load(dsn=dsn)) as journal:
            await journal.persist("Order|o-1", [{"v": value}])
    # 2. the endpoints connect both ways and replicate
    address = {"A": free_address(), "B": free_address()}

    def config(me: str, peer: str, dsn: str) -> EndpointConfig:
        return EndpointConfig.from_dict(
            {"location": me, "dsn": dsn, "listen": address[me], "logs": ["Order"],
             "connections": [{"address": address[peer]}], "retry_delay": 0.2}
        )  # fmt: skip

    async with ReplicationEndpoint(config("A", "B", dsn_a)) as a, ReplicationEndpoint(config("B", "A", dsn_b)) as b:
        async with asyncio.timeout(60):
            while len(await a.store.event_ids("Order")) < 2 or len(await b.store.event_ids("Order")) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        # 3. both locations load the same state; the second write is marked concurrent
        at_a = await ReplicatedEntities(a.journal, a.store).load(Register("o-1"))
        at_b = await ReplicatedEntities(b.journal, b.store).load(Register("o-1"))
    return at_a, at_b


if __name__ == "__main__":
    state_a, state_b = asyncio.run(main(sys.argv[1], sys.argv[2]))
    print("A:", state_a.state, "B:", state_b.state, "concurrent:", [v.event for v in state_a.concurrent])
