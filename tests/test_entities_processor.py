"""Processor idempotency on the projection runner: SIGKILL before and after a write."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from journal import Journal

ROOT = Path(__file__).resolve().parents[1]


async def run(dsn: str, crash: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.processor_worker", dsn, crash,
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None
    assert proc.returncode in (0, -signal.SIGKILL), err.decode()[-2000:]
    return proc.returncode, out.decode()


async def outputs(journal: Journal) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    async for pid in journal.current_persistence_ids("doubled"):
        out += [(e.event["src"], e.event["seq"]) async for e in journal.current_events_by_persistence_id(pid)]
    return sorted(out)


async def test_processor_crash_between_read_and_write_never_duplicates(journal: Journal, dsn: str) -> None:
    for i in range(3):
        await journal.persist(f"src|{i}", [{"i": k} for k in range(4)])
    code, _ = await run(dsn, "before")
    assert code == -signal.SIGKILL
    assert await outputs(journal) == []  # killed before its first write
    code, _ = await run(dsn, "after")  # killed after a write, before the runner stored offsets
    assert code == -signal.SIGKILL
    first = await outputs(journal)
    assert 0 < len(first) < 24
    code, out = await run(dsn, "none")
    assert code == 0 and int(out) == 24 - len(first)  # the written part is not written again
    want = sorted([(f"src|{i}", s) for i in range(3) for s in range(1, 5)] * 2)
    assert await outputs(journal) == want
    # output lands in source order on the target pid of each source pid
    doubled_0 = [e async for e in journal.current_events_by_persistence_id("doubled|0")]
    assert [e.event["seq"] for e in doubled_0] == [1, 1, 2, 2, 3, 3, 4, 4]
    assert doubled_0[-1].metadata == {"processor": "doubler", "source_seq_nr": 4}
    # new source events, a crash after writing them, then a clean run: each output once
    await journal.persist("src|0", [{"i": 9}])
    await journal.persist("src|3", [{"i": 9}])
    assert (await run(dsn, "after"))[0] == -signal.SIGKILL
    code, out = await run(dsn, "none")
    assert code == 0
    assert await outputs(journal) == sorted([*want, *[("src|0", 5), ("src|3", 1)] * 2])
    code, out = await run(dsn, "none")  # nothing new: nothing written
    assert code == 0 and out.strip() == "0"
