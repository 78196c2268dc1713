"""Recovery's replay-retry path against a private PostgreSQL that is really stopped and started."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

import pytest

from journal import EntityRegistry, JournalSettings, RecoveryFailed, open_journal
from journal.postgres.migrations import upgrade
from tests.entity_fixtures import Counter
from tests.support.private_server import crash
from tests.support.waiting import wait_until


class Watched(Counter):
    entity_type = "watched"
    recoveries: list[Exception | None] = []

    def on_recovery(self, error: Exception | None) -> None:
        Watched.recoveries.append(error)


async def test_recovery_retries_while_the_database_is_down(
    private_server: Any, caplog: pytest.LogCaptureFixture
) -> None:
    dsn = private_server.get_uri()
    await asyncio.to_thread(upgrade, dsn)
    settings = JournalSettings.load(
        env={}, dsn=dsn, attempts=1, initial_backoff=0.01, max_backoff=0.05, connect_timeout=1.0,
        replay_retry_max=2, replay_retry_delay=0.05,
    )  # fmt: skip
    Watched.recoveries = []
    caplog.set_level(logging.WARNING, logger="journal.entities")
    async with open_journal(dsn, settings=settings) as journal:
        await journal.persist("watched|r", ["a", "b"])
        await asyncio.to_thread(crash, private_server)

        # down for longer than replay_retry_max attempts: RecoveryFailed, reported to the entity
        async with EntityRegistry(journal) as reg:
            with pytest.raises(RecoveryFailed, match="journal unavailable after 2 attempts"):
                await reg.ask(Watched, "r", ("read",))
            assert len(Watched.recoveries) == 1 and isinstance(Watched.recoveries[0], RecoveryFailed)
            assert not reg.is_active(Watched, "r")  # the failed instance is not used

        # down for a moment: the retries outlast the outage, recovery succeeds
        patient = replace(settings.entities, replay_retry_max=400, replay_retry_delay=0.05)
        caplog.clear()
        async with EntityRegistry(journal, patient) as reg:
            started = asyncio.ensure_future(reg.start(Watched, "r"))
            await wait_until(
                lambda: "recovery of watched|r" in caplog.text and "retry 2" in caplog.text,
                timeout=60, what="two failed recovery attempts",
            )  # fmt: skip
            assert not started.done()
            await asyncio.to_thread(private_server.ensure_postgres_running)
            await asyncio.wait_for(started, 60)
            assert Watched.recoveries[-1] is None
            assert await reg.ask(Watched, "r", ("read",)) == ["a", "b"]
            assert await reg.ask(Watched, "r", ("add", "c")) == ["a", "b", "c"]
