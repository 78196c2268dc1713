"""The horizon under write load: no false "start not visible", and a real one logged once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime, timedelta

import pytest

from journal import Journal, JournalSettings, open_journal
from journal.backend import HorizonReading, WriterInProgress
from journal.conditions import Condition
from journal.query.horizon import HorizonTracker

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


async def test_a_superuser_under_write_load_sees_every_writer_start(
    journal: Journal, dsn: str, settings: JournalSettings, caplog: pytest.LogCaptureFixture
) -> None:
    """pg_locks and pg_stat_activity are read one after the other: writers that finish in between
    are not writers whose start is hidden (that was logged at INFO several times a second)."""
    caplog.set_level(logging.DEBUG, logger="journal.query.horizon")
    stop = time.monotonic() + 3.0
    async with contextlib.AsyncExitStack() as stack:
        writers = [await stack.enter_async_context(open_journal(dsn, settings=settings)) for _ in range(3)]

        async def write(j: Journal, k: int) -> int:
            n = 0
            while time.monotonic() < stop:
                await j.persist(f"quiet|{k}-{n % 30}", [n])
                n += 1
            return n

        async def read() -> int:
            readings = 0
            while time.monotonic() < stop:
                await journal.horizon()
                readings += 1
            return readings

        tasks = [write(j, k) for k, j in enumerate(writers) for _ in range(10)]
        *written, readings = await asyncio.gather(*tasks, read())
    assert sum(written) > 500 and readings > 100, (sum(written), readings)
    noise = [r.getMessage() for r in caplog.records if r.name == "journal.query.horizon"]
    assert noise == [], noise[:3]


def test_an_invisible_writer_start_is_logged_once_and_when_it_clears(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="journal.query.horizon")
    t = HorizonTracker(quiet=0.2)
    t.observe(HorizonReading(now=at(0)))
    for i in range(1, 50):  # a new hidden writer on every reading, as under write load
        w = WriterInProgress(f"{i}/1", 100 + i, None)
        previous = at(10 * (i - 1) + (5 if i > 1 else 0))
        assert t.observe(HorizonReading(now=at(10 * i), writers=(w,))) == previous
        t.observe(HorizonReading(now=at(10 * i + 5)))  # none on the next: not cleared yet (quiet)
    infos = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(infos) == 1 and "not visible" in infos[0], infos
    assert t.invisible.active and t.invisible.count == 49
    time.sleep(0.25)  # the thing under test: the quiet period (0.2 s) passes on the real monotonic clock
    t.observe(HorizonReading(now=at(1000)))
    infos = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(infos) == 2 and "cleared" in infos[1] and "49 occurrences" in infos[1], infos
    assert not t.invisible.active
    t.observe(HorizonReading(now=at(1100), writers=(WriterInProgress("99/1", 7, None),)))
    assert len([r for r in caplog.records if r.levelno >= logging.INFO]) == 3  # a new episode


def test_condition_clears_at_once_without_quiet(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test.condition")
    caplog.set_level(logging.DEBUG, logger="test.condition")
    c = Condition(log, logging.WARNING)
    c.idle()
    assert caplog.records == []
    c.occurred("database unavailable: %s", "refused")
    c.occurred("database unavailable: %s", "refused")
    assert c.active and c.since is not None and c.count == 2
    c.clear("database available again")
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels[0][0] == "WARNING" and "refused" in levels[0][1]
    assert levels[1][0] == "DEBUG"
    assert levels[2][0] == "INFO" and levels[2][1].startswith("database available again: cleared after")
    assert not c.active
