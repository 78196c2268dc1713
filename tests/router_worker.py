"""Subprocess used by tests: ``python -m tests.router_worker DSN SAVE_INTERVAL``.

Hosts the Account entities and an EventRouter over "order" until SIGTERM (then stops cleanly and
prints ``delivered=N duplicates=M``) or SIGKILL (then nothing: the test's crash).
"""

from __future__ import annotations

import asyncio
import signal
import sys

from journal import EntityRegistry, EventRouter, JournalSettings, open_journal
from tests.routing_fixtures import Account


async def main(dsn: str, save_interval: float) -> None:
    settings = JournalSettings.load(env={}, dsn=dsn)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with open_journal(dsn, settings=settings) as j, EntityRegistry(j) as reg:
        reg.register(Account)
        async with EventRouter(reg, ["order"], router_id="crash", save_interval=save_interval) as router:
            print("started", flush=True)
            await stop.wait()
        print(f"delivered={router.delivered} duplicates={router.duplicates}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], float(sys.argv[2])))
