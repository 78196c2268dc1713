"""Processor idempotency: progress stored with the output; a SIGKILL between read and write."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from journal import Journal

ROOT = Path(__file__).resolve().parents[1]


async def run(dsn: str, crash: bool) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.processor_worker", dsn, "1" if crash else "0",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def outputs(journal: Journal) -> list[tuple[str, int]]:
    envs = journal.current_events_by_persistence_id("processor|doubler")
    return [(e.event["src"], e.event["seq"]) async for e in envs]


async def test_processor_crash_between_read_and_write_never_duplicates(journal: Journal, dsn: str) -> None:
    for i in range(3):
        await journal.persist(f"src|{i}", [{"i": k} for k in range(4)])
    code, _ = await run(dsn, crash=True)
    assert code == -signal.SIGKILL
    assert await outputs(journal) == []  # killed before its first write
    code, out = await run(dsn, crash=False)
    assert code == 0 and out.strip() == "24"
    want = sorted([(f"src|{i}", s) for i in range(3) for s in range(1, 5)] * 2)
    assert sorted(await outputs(journal)) == want
    # new source events, then a crash before writing them, then a clean run: each output once
    await journal.persist("src|0", [{"i": 9}])
    assert (await run(dsn, crash=True))[0] == -signal.SIGKILL
    code, out = await run(dsn, crash=False)
    assert out.strip() == "2"
    assert sorted(await outputs(journal)) == sorted([*want, ("src|0", 5), ("src|0", 5)])
    code, out = await run(dsn, crash=False)  # nothing new: nothing written
    assert out.strip() == "0"
