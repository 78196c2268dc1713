"""The projection runner's read-ahead buffer, driven step by step (no database)."""

from __future__ import annotations

import asyncio

import pytest

from projections.read_ahead import ReadAhead


async def test_fifo_and_empty() -> None:
    buf: ReadAhead[int] = ReadAhead(10)
    assert buf.empty()
    for i in range(5):
        await buf.put(i)
    assert buf.qsize() == 5 and not buf.empty()
    assert [buf.get_nowait() for _ in range(5)] == [0, 1, 2, 3, 4]
    with pytest.raises(asyncio.QueueEmpty):
        buf.get_nowait()


async def test_a_full_buffer_holds_the_putter_until_the_getter_takes() -> None:
    buf: ReadAhead[int] = ReadAhead(3)
    putter = asyncio.create_task(_put_all(buf, range(10)))
    got: list[int] = []
    while len(got) < 10:
        got.append(await asyncio.wait_for(buf.get(), 5))
        assert buf.qsize() <= 3  # never more than maxsize held
    await asyncio.wait_for(putter, 5)
    assert got == list(range(10))


async def test_get_waits_for_an_item_and_can_time_out() -> None:
    buf: ReadAhead[str] = ReadAhead(2)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(buf.get(), 0.05)
    waiter = asyncio.create_task(buf.get())
    await asyncio.sleep(0)
    assert not waiter.done()
    await buf.put("x")
    assert await asyncio.wait_for(waiter, 5) == "x"
    assert buf.empty()


def test_maxsize_must_be_positive() -> None:
    with pytest.raises(ValueError, match="maxsize"):
        ReadAhead(0)


async def _put_all(buf: ReadAhead[int], items: range) -> None:
    for i in items:
        await buf.put(i)
