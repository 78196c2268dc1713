"""Subprocess for the reliable-delivery tests: ``python -m tests.reliable_worker MODE DSN ID FILE``.

- ``place``: places order ID with Order.crash_between_writes set: the process SIGKILLs itself
  after ``placed`` is written, before its follow-up is.
- ``send``: entity Sender ID sends ``m1`` to the sink, which appends ``<pid> <delivery> <attempt>``
  to FILE and never confirms; runs until killed.
- ``confirm``: starts Sender ID (recovery redelivers); the sink appends to FILE and confirms;
  prints ``confirmed`` and exits once nothing is unconfirmed.
- ``scan-send`` and ``scan``: as ``send`` and ``confirm``, with a DeliveryScan over Sender running,
  and ``scan`` never addresses Sender ID: it exits once the confirmation is in the journal.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from journal import DeliveryScan, EntityRegistry, JournalSettings, open_journal
from journal.entities import Delivery
from tests.reliable_fixtures import Order, Sender
from tests.support.waiting import wait_until


async def main(mode: str, dsn: str, entity_id: str, file: str) -> None:
    settings = JournalSettings.load(env={}, dsn=dsn)
    async with open_journal(dsn, settings=settings) as j, EntityRegistry(j) as reg:
        if mode.startswith("scan"):
            await scanning(mode, reg, entity_id, file)
            return
        if mode == "place":
            Order.crash_between_writes = True
            await reg.ask(Order, entity_id, ("place", "x"))
            raise SystemExit("not killed")

        async def sink(d: Delivery) -> None:
            line = f"{os.getpid()} {d.delivery_id} {d.attempt} {d.message}\n"
            await asyncio.to_thread(_append, file, line)
            if mode == "confirm":
                await reg.ask_pid(d.sender, ("confirm", d.delivery_id))

        reg.add_destination("sink", sink)
        if mode == "send":
            await reg.ask(Sender, entity_id, ("send", "m1"))
            await asyncio.Event().wait()  # until killed
        await reg.start(Sender, entity_id)
        await wait_until(lambda: _none(reg.ask(Sender, entity_id, ("unconfirmed",))), 60, "the confirmation")
        print("confirmed", flush=True)


async def scanning(mode: str, reg: EntityRegistry, entity_id: str, file: str) -> None:
    async def sink(d: Delivery) -> None:
        await asyncio.to_thread(_append, file, f"{os.getpid()} {d.delivery_id} {d.attempt} {d.message}\n")
        if mode == "scan":
            await reg.ask_pid(d.sender, ("confirm", d.delivery_id))

    reg.add_destination("sink", sink)
    async with DeliveryScan(reg, [Sender], save_interval=0.2, lease_ttl=3.0, renew_interval=0.5):
        if mode == "scan-send":
            await reg.ask(Sender, entity_id, ("send", "m1"))
            await asyncio.Event().wait()  # until killed

        async def confirmed() -> bool:  # read from the journal: the sender is never addressed
            pid = f"{Sender.entity_type}|{entity_id}"
            events = [e.event async for e in reg.journal.current_events_by_persistence_id(pid)]
            return any(e.startswith("confirmed:") for e in events)

        await wait_until(confirmed, 60, "the confirmation")
        print("confirmed", flush=True)


def _append(file: str, line: str) -> None:
    with Path(file).open("a") as f:
        f.write(line)


async def _none(reply: Any) -> bool:
    return not await reply


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
