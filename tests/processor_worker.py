"""Subprocess: run the doubling processor; with CRASH=1 it SIGKILLs itself right before writing."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from journal import JournalSettings, open_journal
from journal.entities import Processor


def double(env: object) -> list[object]:
    return [{"src": env.persistence_id, "seq": env.seq_nr}] * 2  # type: ignore[attr-defined]


async def main(dsn: str, crash: bool) -> None:
    settings = JournalSettings.load(env={}, dsn=dsn)
    async with open_journal(dsn, settings=settings) as j:
        p = Processor(j, j, "doubler", "src", double, batch_size=10)
        if crash:
            p.before_write = lambda: os.kill(os.getpid(), signal.SIGKILL)
        print(await p.run_once(), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] == "1"))
