"""Two processes writing one pid: the journal's SequenceConflict makes the entity restart."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from journal import EntityRegistry, Journal, SequenceConflict
from tests.entity_fixtures import Counter

ROOT = Path(__file__).resolve().parents[1]


async def run_worker(dsn: str, entity_id: str, tag: str, n: int) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.entity_worker", dsn, entity_id, tag, str(n),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_other_process_write_causes_conflict_then_restart(journal: Journal, dsn: str) -> None:
    async with EntityRegistry(journal) as reg:
        assert await reg.ask(Counter, "shared", ("add", "a")) == ["a"]
        out = await run_worker(dsn, "shared", "b", 1)  # another process appends b-0
        assert "state=2" in out
        with pytest.raises(SequenceConflict):
            await reg.ask(Counter, "shared", ("add", "c"))
        assert await reg.ask(Counter, "shared", ("add", "c")) == ["a", "b-0", "c"]
    events = [e.event async for e in journal.current_events_by_persistence_id("counter|shared")]
    assert events == ["a", "b-0", "c"]


async def test_two_processes_concurrently_lose_nothing(journal: Journal, dsn: str) -> None:
    n = 25
    outs = await asyncio.gather(run_worker(dsn, "both", "p1", n), run_worker(dsn, "both", "p2", n))
    envs = [e async for e in journal.current_events_by_persistence_id("counter|both")]
    assert [e.seq_nr for e in envs] == list(range(1, 2 * n + 1))
    events = [e.event for e in envs]
    assert sorted(events) == sorted([f"p1-{i}" for i in range(n)] + [f"p2-{i}" for i in range(n)])
    assert [e for e in events if e.startswith("p1")] == [f"p1-{i}" for i in range(n)]  # per-process order
    assert all("state=" in o for o in outs)
