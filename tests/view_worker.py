"""Subprocess used by tests: ``python -m tests.view_worker DSN VECTOR_TIME_JSON``.

Starts the Trail view (from its snapshot, if any), waits until it has seen the vector time, and
prints ``{"applied": n, "duplicates": d, "state": [...]}`` as JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys

from journal import JournalSettings, VectorTime, open_journal
from tests.routing_fixtures import Trail


async def main(dsn: str, after: str) -> None:
    settings = JournalSettings.load(env={}, dsn=dsn)
    async with open_journal(dsn, settings=settings) as j, Trail(j) as view:
        state = await view.ask("all", after=VectorTime(json.loads(after)), timeout=20)
        print(json.dumps({"applied": view.applied, "duplicates": view.duplicates, "state": state}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
