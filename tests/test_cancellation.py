"""Cancelling what waits with a time limit ends it, under write load, every time.

``asyncio.wait_for`` on Python 3.11 can swallow a cancellation that arrives as the awaited wake-up
(or the timeout) completes: the live query's loop then goes on polling for ever (12 of 125
cancellations of a live slice query were lost that way). The library's waits go through
:mod:`journal.waits`; these tests cancel live queries and a projection worker at random moments
while writes keep waking them, many times, and require each to end within a few seconds."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from journal import EventEnvelope, Journal, JournalSettings
from projections import Worker
from tests.support.waiting import wait_until

T = "Cancel"
PROMPT = 3.0
"""Seconds a cancelled task may take to end."""


@pytest.fixture
async def load(journal: Journal) -> AsyncIterator[None]:
    """Writers that keep committing (and so notifying, waking every live query of T)."""
    stop = asyncio.Event()

    async def writer(w: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            await journal.persist(f"{T}|w{w}-{n % 50}", [{"n": n}], tags=["blue"])

    tasks = [asyncio.ensure_future(writer(w)) for w in range(4)]
    yield
    stop.set()
    await asyncio.gather(*tasks)


async def _cancel_many(start: Callable[[], Coroutine[Any, Any, None]], rounds: int) -> list[int]:
    """Start, let run a random moment (the scenario: a cancel at any time), cancel; the rounds
    whose task did not end within PROMPT seconds (each such task is cancelled again until it ends)."""
    rng = random.Random(21)
    stuck: list[int] = []
    for i in range(rounds):
        task = asyncio.ensure_future(start())
        await asyncio.sleep(rng.uniform(0.0, 0.05))
        task.cancel()
        done, _ = await asyncio.wait([task], timeout=PROMPT)
        if not done:
            stuck.append(i)
            while not task.done():  # a loop that swallowed one cancel: end it to go on
                task.cancel()
                await asyncio.wait([task], timeout=0.5)
    return stuck


async def _drain(events: AsyncIterator[EventEnvelope]) -> None:
    async for _ in events:
        pass


async def test_cancelled_live_slice_and_tag_queries_end_under_write_load(journal: Journal, load: None) -> None:
    slices = await _cancel_many(lambda: _drain(journal.events_by_slices(T, 0, 1023)), 125)
    assert slices == [], f"live slice queries that ignored cancel(): rounds {slices}"
    tags = await _cancel_many(lambda: _drain(journal.events_by_tag("blue")), 60)
    assert tags == [], f"live tag queries that ignored cancel(): rounds {tags}"


async def test_cancelled_projection_processors_end_under_write_load(journal: Journal, dsn: str, load: None) -> None:
    """A worker's processors wait for envelopes with a time limit (its read-ahead queue); under
    write load one arrives at about any moment. The worker cancels a processor that does not
    stop in time: each cancel must end it (it is started again on the next lease round)."""
    settings = JournalSettings.load(
        env={}, dsn=dsn, lease_ttl=1.0, lease_renew_interval=0.05, handler_backoff=0.01, refresh_interval=0.05
    )

    async def handle(envelope: EventEnvelope) -> None:
        pass

    worker = Worker(journal, settings, "cancel-me", T, handle, "at-least-once")
    run = asyncio.ensure_future(worker.run())
    rng = random.Random(21)
    stuck: list[int] = []
    try:
        for i in range(60):
            await wait_until(lambda: _running(worker) is not None, 30, "a running processor")
            task = _running(worker)
            assert task is not None
            await asyncio.sleep(rng.uniform(0.0, 0.03))  # the scenario: a cancel at any moment
            task.cancel()
            await asyncio.wait([task], timeout=PROMPT)
            if not task.cancelled():
                stuck.append(i)
                while not task.done():
                    task.cancel()
                    await asyncio.wait([task], timeout=0.5)
    finally:
        worker.stop()
        await run
    assert stuck == [], f"processors that ignored cancel(): rounds {stuck}"


def _running(worker: Worker) -> asyncio.Task[None] | None:
    return next((t for _, t in worker.processors.values() if not t.done()), None)
