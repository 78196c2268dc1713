"""Subprocess used by tests: ``python -m tests.router_worker DSN SAVE_INTERVAL [ROUTER_ID LEASE_TTL RENEW]``.

Hosts the Account entities and an EventRouter over "order" until SIGTERM (then stops cleanly and
prints ``delivered=N duplicates=M``) or SIGKILL (then nothing: the test's crash). Several of them
with the same router id share the slices through leases.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from journal import EntityRegistry, EventRouter, JournalSettings, open_journal
from tests.routing_fixtures import Account


async def main(dsn: str, save_interval: float, router_id: str, lease_ttl: float | None, renew: float | None) -> None:
    settings = JournalSettings.load(env={}, dsn=dsn)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with open_journal(dsn, settings=settings) as j, EntityRegistry(j) as reg:
        reg.register(Account)
        async with EventRouter(
            reg, ["order"], router_id=router_id, save_interval=save_interval, lease_ttl=lease_ttl, renew_interval=renew
        ) as router:
            print("started", flush=True)
            await stop.wait()
        print(f"delivered={router.delivered} duplicates={router.duplicates}", flush=True)


ROOT = Path(__file__).resolve().parents[1]


async def start_router(dsn: str, *args: str) -> asyncio.subprocess.Process:
    """This module as a process (``args``: SAVE_INTERVAL [ROUTER_ID LEASE_TTL RENEW]), once it
    has started its router."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.router_worker", dsn, *args,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line == b"started\n", (line, await proc.stderr.read() if proc.stderr else b"")
    return proc


if __name__ == "__main__":
    more = sys.argv[3:]
    asyncio.run(
        main(
            sys.argv[1],
            float(sys.argv[2]),
            more[0] if more else "crash",
            float(more[1]) if len(more) > 1 else None,
            float(more[2]) if len(more) > 2 else None,
        )
    )
