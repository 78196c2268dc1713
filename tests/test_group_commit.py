"""The batch planner, driven step by step (no database)."""

from __future__ import annotations

import asyncio

from journal.backend import WriteRequest
from journal.group_commit import BatchPlanner, Pending
from journal.serialization import Serialized

EV = Serialized(1, "", b"{}")


def pending(pid: str, n: int = 1) -> Pending:
    fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    return Pending(WriteRequest(pid, "t", 0, None, (EV,) * n), fut)  # type: ignore[arg-type]


def pids(batch: list[Pending]) -> list[str]:
    return [p.request.persistence_id for p in batch]


async def test_fifo_one_call_per_pid_and_in_flight_blocking() -> None:
    planner = BatchPlanner(max_batch_events=100)
    planner.queue.extend([pending("a"), pending("b"), pending("a"), pending("c"), pending("b")])
    first = planner.next_batch()
    assert pids(first) == ["a", "b", "c"]
    assert pids(planner.next_batch()) == []  # a and b are in flight
    planner.done(first)
    assert pids(planner.next_batch()) == ["a", "b"]


async def test_event_bound_and_oversized_calls() -> None:
    planner = BatchPlanner(max_batch_events=5)
    planner.queue.extend([pending("a", 3), pending("b", 3), pending("c", 2), pending("big", 9)])
    b1 = planner.next_batch()
    assert pids(b1) == ["a", "c"]
    planner.done(b1)
    b2 = planner.next_batch()
    assert pids(b2) == ["b"]
    planner.done(b2)
    assert pids(planner.next_batch()) == ["big"]  # alone, even though it exceeds the bound


async def test_cancelled_calls_are_dropped() -> None:
    planner = BatchPlanner(max_batch_events=10)
    p = pending("a")
    p.future.cancel()
    planner.queue.extend([p, pending("b")])
    assert pids(planner.next_batch()) == ["b"]
