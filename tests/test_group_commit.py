"""The batch planner, driven step by step (no database)."""

from __future__ import annotations

import asyncio
from collections import deque
from datetime import UTC, datetime

from journal.group_commit import BatchPlanner, Pending
from journal.write_batch import BatchResult, WriteBatch
from tests.support.waiting import wait_until


def call(pid: str, n: int = 1, expected: int | None = None) -> WriteBatch:
    """A batch of one call of ``n`` events."""
    return WriteBatch((pid,), ("t",), (0,), (expected,), (n,), (b"{}",) * n, (1,) * n, ("",) * n, ((),), (None,))


def pending(pid: str, n: int = 1) -> Pending:
    fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    return Pending(call(pid, n), fut)


def pids(batch: list[Pending]) -> list[str]:
    return [pid for p in batch for pid in p.batch.persistence_ids]


async def no_chunks(chunks: object) -> list[BatchResult]:
    raise AssertionError("no bulk write here")


def all_written(batch: WriteBatch, now: datetime) -> BatchResult:
    return BatchResult([(e or 0) + 1 for e in batch.expected_seq_nrs], [now] * len(batch))


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


async def test_queued_calls_never_wait_forever_when_a_batch_finishes() -> None:
    """Regression: a finishing batch must free its slot before it pumps the queue (max_in_flight=1)."""
    from journal.group_commit import GroupCommit

    now = datetime.now(UTC)
    sizes: list[int] = []

    async def write_batch(batch: WriteBatch) -> BatchResult:
        sizes.append(len(batch))
        await asyncio.sleep(0)  # yield, as a real write does
        return all_written(batch, now)

    gc = GroupCommit(write_batch, no_chunks, max_batch_events=50, max_in_flight=1)

    async def caller(i: int) -> None:
        for k in range(5):
            await gc.submit(call(f"p|{i}", expected=k))

    await asyncio.wait_for(asyncio.gather(*(caller(i) for i in range(200))), timeout=20)
    assert sum(sizes) == 1000
    assert max(sizes) <= 50 and len(sizes) < 1000  # batched, and bounded
    await gc.close()


def test_plan_chunks_in_order_bounded_and_a_large_call_alone() -> None:
    from journal.group_commit import plan_chunks

    counts = [3, 3, 3, 10, 1, 1, 4]
    assert plan_chunks(counts, 6) == [(0, 2), (2, 3), (3, 4), (4, 7)]
    assert plan_chunks(counts, 100) == [(0, 7)]
    assert plan_chunks([], 5) == []
    assert plan_chunks([1] * 7, 3) == [(0, 3), (3, 6), (6, 7)]


async def test_a_large_batch_wakes_its_callers_in_two_waves_and_sends_the_first_waves_calls_between() -> None:
    """The first half's next calls go out before the second half is woken, so the server writes
    them while the client wakes the rest (see GroupCommit._release)."""
    from journal.group_commit import RELEASE_WAVE_MIN, GroupCommit

    now = datetime.now(UTC)
    callers = 2 * RELEASE_WAVE_MIN + 11
    log: list[tuple[str, object]] = []  # ("batch", its pids) and ("woke", pid), in order
    all_queued = asyncio.Event()

    async def write_batch(batch: WriteBatch) -> BatchResult:
        log.append(("batch", list(batch.persistence_ids)))
        if len(log) == 1:  # caller 0, written alone: held until every other caller queued
            await all_queued.wait()
        await asyncio.sleep(0)
        return all_written(batch, now)

    gc = GroupCommit(write_batch, no_chunks, max_batch_events=5000, max_in_flight=1)

    async def caller(i: int) -> None:
        await gc.submit(call(f"p|{i}", expected=0))
        log.append(("woke", f"p|{i}"))
        await gc.submit(call(f"p|{i}", expected=1))

    tasks = asyncio.gather(*(caller(i) for i in range(callers)))
    await wait_until(lambda: len(gc._planner.queue) == callers - 1, what="every other caller queued")
    all_queued.set()
    await asyncio.wait_for(tasks, timeout=10)
    assert log[0] == ("batch", ["p|0"])
    assert log[1] == ("woke", "p|0")
    big = log[2][1]
    assert log[2][0] == "batch" and big == [f"p|{i}" for i in range(1, callers)]
    assert isinstance(big, list)
    half = len(big) // 2
    after = log[3:]
    assert after[:half] == [("woke", pid) for pid in big[:half]]  # the first wave
    assert after[half] == ("batch", ["p|0", *big[:half]])  # its next calls, sent before ...
    assert after[half + 1 : len(big) + 1] == [("woke", pid) for pid in big[half:]]  # ... the second wave wakes
    await gc.close()


async def test_close_delivers_the_second_wave() -> None:
    """close() called by a caller of a finished batch's first wave returns only once the
    second wave has its results too."""
    from journal.group_commit import RELEASE_WAVE_MIN, GroupCommit

    now = datetime.now(UTC)
    release = asyncio.Event()

    async def write_batch(batch: WriteBatch) -> BatchResult:
        await release.wait()
        return all_written(batch, now)

    gc = GroupCommit(write_batch, no_chunks, max_batch_events=5000, max_in_flight=1)
    n = 2 * RELEASE_WAVE_MIN + 1
    settled_at_close: list[int] = []

    async def caller(i: int) -> None:
        await gc.submit(call(f"p|{i}", expected=0))
        if i == 1:  # the batch's first call: in its first wave
            await gc.close()
            settled_at_close.append(sum(p.future.done() for p in batch))

    calls = [asyncio.ensure_future(caller(i)) for i in range(n)]
    await wait_until(lambda: len(gc._planner.queue) == n - 1, what="the rest queued behind the first")
    batch = list(gc._planner.queue)
    release.set()
    await asyncio.wait_for(asyncio.gather(*calls), timeout=10)
    assert settled_at_close == [n - 1]


async def test_a_call_waiting_for_its_range_is_finished_apart_in_order_without_a_slot() -> None:
    """A backend that defers a call (its range is fenced: WriteLater) gets the batch's other
    calls answered at once, its slot back for the next batches, and the waiting call's pid held:
    a later call of that pid is written only after it (one slot: max_in_flight=1)."""
    from journal.group_commit import GroupCommit
    from journal.write_batch import ResultBuilder, WriteLater

    now = datetime.now(UTC)
    fence = asyncio.Event()
    written: list[str] = []

    async def write_batch(batch: WriteBatch) -> BatchResult:
        await asyncio.sleep(0)
        out = ResultBuilder(len(batch))
        held = [i for i, p in enumerate(batch.persistence_ids) if p.startswith("fenced") and not fence.is_set()]
        for i, p in enumerate(batch.persistence_ids):
            if i not in held:
                written.append(f"{p}@{batch.expected_seq_nrs[i]}")
                out.written(i, (batch.expected_seq_nrs[i] or 0) + 1, now)
        if held:
            rest = batch.select(held)

            async def finish() -> BatchResult:
                await fence.wait()
                if None in rest.expected_seq_nrs:  # a first call finishes slowly: a later one must not pass it
                    await asyncio.sleep(0.05)
                written.extend(f"{p}@{e}" for p, e in zip(rest.persistence_ids, rest.expected_seq_nrs, strict=True))
                return all_written(rest, now)

            later = WriteLater(held, finish)
            for i in held:
                out.failed(i, later)
        return out.result()

    gc = GroupCommit(write_batch, no_chunks, max_batch_events=50, max_in_flight=1)
    alone = asyncio.ensure_future(gc.submit(call("fenced|0")))  # the idle path, deferred
    await wait_until(lambda: gc._direct_apart == 1, 5, "the lone call waiting apart")
    after = asyncio.ensure_future(gc.submit(call("fenced|0", expected=1)))  # queued: not the idle path
    first = asyncio.ensure_future(gc.submit(call("busy|0")))
    waiting = asyncio.ensure_future(gc.submit(call("fenced|1")))
    others = [asyncio.ensure_future(gc.submit(call(f"p|{i}"))) for i in range(100)]
    again = asyncio.ensure_future(gc.submit(call("fenced|1", expected=1)))  # the same pid, later
    await asyncio.wait_for(asyncio.gather(first, *others), timeout=5)  # answered while one call waits
    more = [asyncio.ensure_future(gc.submit(call(f"q|{i}"))) for i in range(100)]
    await asyncio.wait_for(asyncio.gather(*more), timeout=5)  # the slot is free for new batches
    assert not waiting.done() and not again.done()
    assert not [p for p in written if p.startswith("fenced")]
    assert not alone.done() and not after.done()
    fence.set()
    assert (await waiting)[0] == 1 and (await again)[0] == 2
    assert (await alone)[0] == 1 and (await after)[0] == 2
    assert [p for p in written if p.startswith("fenced|0")] == ["fenced|0@None", "fenced|0@1"]  # in order
    assert [p for p in written if p.startswith("fenced|1")] == ["fenced|1@None", "fenced|1@1"]
    await gc.close()


async def test_calls_deferred_apart_in_one_result_are_each_answered_when_their_own_wait_ends() -> None:
    """A backend that defers several calls of one batch each on its own wait (a WriteLater per
    call: Cassandra's tag rows) gets each answered when its own wait ends, the others at once;
    a bulk write's chunk holding calls of two waits is answered when both end."""
    from journal.group_commit import GroupCommit
    from journal.write_batch import ResultBuilder, WriteLater

    now = datetime.now(UTC)
    gates: dict[str, asyncio.Event] = {}

    async def write_batch(batch: WriteBatch) -> BatchResult:
        await asyncio.sleep(0)
        out = ResultBuilder(len(batch))
        for i, p in enumerate(batch.persistence_ids):
            out.written(i, 1, now)
            if p.startswith("held"):
                gate = gates.setdefault(p, asyncio.Event())

                async def finish(gate: asyncio.Event = gate) -> BatchResult:
                    await gate.wait()
                    return BatchResult([1], [now])

                out.failed(i, WriteLater([i], finish))
        return out.result()

    gc = GroupCommit(write_batch, no_chunks, max_batch_events=50, max_in_flight=1)
    first = asyncio.ensure_future(gc.submit(call("held|first")))  # the idle path, deferred
    await wait_until(lambda: gc._direct_apart == 1, 5, "the lone call waiting apart")
    held = [asyncio.ensure_future(gc.submit(call(f"held|{i}"))) for i in range(3)]
    others = [asyncio.ensure_future(gc.submit(call(f"p|{i}"))) for i in range(20)]
    chunk = WriteBatch.concat([call("held|a"), call("p|a"), call("held|b")])
    bulk = asyncio.ensure_future(gc.submit_chunks(iter([chunk])))  # queued: its chunk shares a batch
    await asyncio.wait_for(asyncio.gather(*others), timeout=5)
    gates["held|1"].set()
    assert await asyncio.wait_for(held[1], 5) == (1, now)
    assert not held[0].done() and not held[2].done() and not first.done()
    gates["held|a"].set()
    await wait_until(lambda: gc._planner.queue == deque(), 5, "the queue drained")
    assert not bulk.done()  # held|b still waits
    gates["held|b"].set()
    _, (result,) = await asyncio.wait_for(bulk, 5)
    assert list(result.first_seq_nrs) == [1, 1, 1] and not result.errors
    for g in ("held|0", "held|2", "held|first"):
        gates[g].set()
    assert await asyncio.wait_for(asyncio.gather(first, *held), 5) == [(1, now)] * 4
    await gc.close()
