"""Subprocess: run the doubling processor on the projection runner until it is caught up.

argv: dsn, crash mode ("none", "before": SIGKILL right before its first write, "after": SIGKILL
right after its first write, before the runner commits offsets). Prints the events it wrote.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from journal import EventEnvelope, JournalSettings, open_journal
from journal.entities import Processor, WriterHandler
from projections import Worker
from projections.management import processed_up_to
from tests.support.waiting import wait_until


def double(env: EventEnvelope) -> list[object]:
    return [{"src": env.persistence_id, "seq": env.seq_nr}] * 2


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def main(dsn: str, crash: str) -> None:
    settings = JournalSettings.load(
        env={}, dsn=dsn, lease_ttl=1.5, lease_renew_interval=0.3, handler_backoff=0.02, group_size=50
    )
    async with open_journal(dsn, settings=settings) as j:
        p = Processor(j, "doubler", "doubled", double, batch_size=5)
        if crash == "before":
            p.before_write = die
        elif crash == "after":
            p.after_write = die
        worker = Worker(j, settings, "doubler", "src", WriterHandler(p), "grouped")
        task = asyncio.create_task(worker.run())
        targets = {pid: await j.highest_seq_nr(pid) async for pid in j.current_persistence_ids("src")}

        async def caught_up_or_failed() -> bool:
            return task.done() or await processed_up_to(j, "doubler", targets)

        try:
            await wait_until(caught_up_or_failed, 30, "the processor to catch up", every=0.05)
        except AssertionError as e:
            raise SystemExit(str(e)) from None
        if task.done():
            raise SystemExit(f"processor stopped before it caught up: {task}")
        worker.stop()
        await task
        print(p.written, flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
