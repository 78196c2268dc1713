"""Subprocess used by tests: ``python -m tests.entity_worker DSN PID_ID TAG N``.

Adds N events ``TAG-i`` to ``counter|PID_ID`` through an EntityRegistry, retrying each command
on SequenceConflict (the entity restarts from the journal), and prints the final state length.
"""

from __future__ import annotations

import asyncio
import sys

from journal import EntityRegistry, JournalSettings, SequenceConflict, open_journal
from tests.entity_fixtures import Counter


async def main(dsn: str, entity_id: str, tag: str, n: int) -> None:
    settings = JournalSettings.load(env={}, dsn=dsn)
    conflicts = 0
    async with open_journal(dsn, settings=settings) as j, EntityRegistry(j) as reg:
        for i in range(n):
            while True:
                try:
                    await reg.ask(Counter, entity_id, ("add", f"{tag}-{i}"))
                    break
                except SequenceConflict:
                    conflicts += 1
        state = await reg.ask(Counter, entity_id, ("read",))
    print(f"conflicts={conflicts} state={len(state)}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
