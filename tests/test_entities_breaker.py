"""Circuit breaker against a private embedded PostgreSQL that is stopped and restarted.

Never touches the shared server: this test starts its own cluster in a temporary directory.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from journal import CircuitBreakerOpen, EntityRegistry, JournalSettings, JournalUnavailable, open_journal
from journal.entities import BreakerState
from journal.postgres.migrations import upgrade
from tests.entity_fixtures import Counter
from tests.support.private_server import crash
from tests.support.waiting import wait_until


async def test_breaker_opens_when_database_stops_and_closes_when_it_answers(private_server: object) -> None:
    dsn = private_server.get_uri()  # type: ignore[attr-defined]
    await asyncio.to_thread(upgrade, dsn)
    settings = JournalSettings.load(
        env={}, dsn=dsn, attempts=2, initial_backoff=0.01, max_backoff=0.05, connect_timeout=1.0,
        breaker_failures=2, breaker_reset_timeout=0.3,
    )  # fmt: skip
    async with open_journal(dsn, settings=settings) as j, EntityRegistry(j) as reg:
        for e in ("e1", "e2", "e3"):
            await reg.ask(Counter, e, ("add", "before"))
        assert reg.breaker.state is BreakerState.CLOSED

        await asyncio.to_thread(crash, private_server)
        for e in ("e1", "e2"):
            with pytest.raises(JournalUnavailable) as info:
                await reg.ask(Counter, e, ("add", "during"))
            assert not isinstance(info.value, CircuitBreakerOpen)
        assert reg.breaker.state is BreakerState.OPEN

        t0 = time.monotonic()
        with pytest.raises(CircuitBreakerOpen) as opened:
            await reg.ask(Counter, "e3", ("add", "rejected"))
        assert time.monotonic() - t0 < 0.2  # failed at once, no I/O
        assert opened.value.outcome_unknown is False
        assert await reg.ask(Counter, "e1", ("read",)) == ["before"]  # reads still served

        await asyncio.to_thread(private_server.ensure_postgres_running)  # type: ignore[attr-defined]

        async def accepted() -> list[str] | None:  # rejected (open) until a trial write succeeds
            try:
                return list(await reg.ask(Counter, "e3", ("add", "after")))
            except JournalUnavailable:
                return None

        assert await wait_until(accepted, 30, "the breaker to close", every=0.05) == ["before", "after"]
        assert reg.breaker.state is BreakerState.CLOSED
        assert reg.breaker.times_opened >= 1
        assert await reg.ask(Counter, "e1", ("add", "again")) == ["before", "again"]
    async with open_journal(dsn, settings=settings) as j2:
        for e, want in (("e1", ["before", "again"]), ("e2", ["before"]), ("e3", ["before", "after"])):
            assert [x.event async for x in j2.current_events_by_persistence_id(f"counter|{e}")] == want
