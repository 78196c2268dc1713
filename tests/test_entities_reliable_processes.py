"""persist_on_event and confirmed delivery across real process deaths (SIGKILL)."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from journal import EntityRegistry, Journal
from journal.entities import Delivery
from tests.reliable_fixtures import Order, Sender
from tests.support.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]


async def spawn(mode: str, dsn: str, entity_id: str, file: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.reliable_worker", mode, dsn, entity_id, str(file),
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip


async def test_process_killed_between_trigger_and_follow_up(journal: Journal, dsn: str, tmp_path: Path) -> None:
    proc = await spawn("place", dsn, "k1", tmp_path / "unused")
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    envs = [e async for e in journal.current_events_by_persistence_id("order|k1")]
    assert [e.event for e in envs] == ["placed:x"]  # died before the follow-up was written

    async with EntityRegistry(journal) as reg:  # the restarted service
        await reg.start(Order, "k1")
        await wait_until(lambda: _events(journal, "order|k1", 3), what="follow-ups written by recovery", timeout=60)
    for _ in range(2):  # recovered again: nothing written again
        async with EntityRegistry(journal) as reg:
            assert await reg.ask(Order, "k1", ("read",)) == ["placed:x", "reserved:x", "shipped:x"]
    envs = [e async for e in journal.current_events_by_persistence_id("order|k1")]
    assert [e.event for e in envs] == ["placed:x", "reserved:x", "shipped:x"]
    assert [e.metadata["on_event_of"][str(e.seq_nr)] for e in envs[1:]] == [1, 2]


async def _events(journal: Journal, pid: str, n: int) -> bool:
    return len([e async for e in journal.current_events_by_persistence_id(pid)]) >= n


async def test_sender_killed_before_confirmation_redelivers_after_restart(
    journal: Journal, dsn: str, tmp_path: Path
) -> None:
    log = tmp_path / "sink.log"
    first = await spawn("send", dsn, "k2", log)
    try:  # the first process delivers (and redelivers) but never confirms
        await wait_until(lambda: _lines(log) >= 2, what="a delivery and a redelivery", timeout=60)
    finally:
        first.kill()
        await first.communicate()
    assert first.returncode == -signal.SIGKILL
    before = _parse(log)
    assert {(d, m) for _, d, _, m in before} == {("d-1", "m1")}
    assert [a for _, _, a, _ in before][:2] == [1, 2]

    second = await spawn("confirm", dsn, "k2", log)  # restarted sender: recovers, redelivers
    out, err = await asyncio.wait_for(second.communicate(), 120)
    assert second.returncode == 0 and b"confirmed" in out, err.decode()
    after = _parse(log)[len(before) :]
    assert after and all(pid == str(second.pid) and d == "d-1" for pid, d, _, _ in after)

    envs = [e async for e in journal.current_events_by_persistence_id("sender|k2")]
    assert [e.event for e in envs] == ["send:m1", "confirmed:d-1"]  # confirmed exactly once

    seen: list[Delivery] = []
    async with EntityRegistry(journal) as reg:  # a third start: nothing left to deliver
        reg.add_destination("sink", seen.append)
        await reg.start(Sender, "k2")
        assert await reg.ask(Sender, "k2", ("unconfirmed",)) == []
    assert seen == []


async def test_a_sender_nobody_addresses_after_a_restart_redelivers_through_the_delivery_scan(
    journal: Journal, dsn: str, tmp_path: Path
) -> None:
    log = tmp_path / "sink.log"
    first = await spawn("scan-send", dsn, "k3", log)
    try:  # delivered (and redelivered), never confirmed
        await wait_until(lambda: _lines(log) >= 2, what="a delivery and a redelivery", timeout=60)
    finally:
        first.kill()
        await first.communicate()
    before = len(_parse(log))
    second = await spawn("scan", dsn, "k3", log)  # runs the scan only: nobody asks sender|k3 anything
    out, err = await asyncio.wait_for(second.communicate(), 120)
    assert second.returncode == 0 and b"confirmed" in out, err.decode()
    after = _parse(log)[before:]
    assert after and all(pid == str(second.pid) and d == "d-1" for pid, d, _, _ in after)
    envs = [e async for e in journal.current_events_by_persistence_id("sender|k3")]
    assert [e.event for e in envs] == ["send:m1", "confirmed:d-1"]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _parse(path: Path) -> list[tuple[str, str, int, str]]:
    out = []
    for line in path.read_text().splitlines():
        pid, d, attempt, msg = line.split()
        out.append((pid, d, int(attempt), msg))
    return out
