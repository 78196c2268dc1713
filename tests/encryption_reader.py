"""A fresh process that reads (or forgets) with an encrypting journal (the encryption tests run it).

``python -m tests.encryption_reader DSN read PID...``: one JSON line per pid, its events' values
(a Forgotten one as ``{"forgotten": subject}``) and its snapshot; ``... forget SUBJECT``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from journal import Forgotten, JournalSettings, open_journal


def plain(value: Any) -> Any:
    return {"forgotten": value.subject} if isinstance(value, Forgotten) else value


async def main(dsn: str, verb: str, args: list[str]) -> None:
    settings = JournalSettings.load(env={}, dsn=dsn, encrypt=True)
    async with open_journal(dsn, settings=settings) as j:
        if verb == "forget":
            print(json.dumps(await j.forget(args[0])))
            return
        for pid in args:
            events = [plain(e.event) async for e in j.current_events_by_persistence_id(pid)]
            snap = await j.load_snapshot(pid)
            print(json.dumps({"pid": pid, "events": events, "snapshot": plain(snap.state) if snap else None}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
