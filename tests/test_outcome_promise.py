"""The outcome promise of a write with ``expected_seq_nr`` (docs/outages.md), on a real server
crashed with ``pg_ctl stop -m immediate`` while the write waits inside the server.

Its outcome is always exact when the database answers the journal's check within the check's
retries (``retry.attempts`` with backoff); ``outcome_unknown=True`` comes only when the database
stays away for all of them, and ``resolve_persist`` then answers exactly once it is back.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from journal import JournalSettings, JournalUnavailable, open_journal
from journal.postgres.migrations import upgrade
from tests.support.private_server import crash
from tests.support.waiting import wait_until

PID = "promise|1"


async def _write_waiting_in_the_server(dsn: str) -> asyncpg.Connection:
    """A session holding a lock every insert of event_journal waits for."""
    blocker = await asyncpg.connect(dsn)
    await blocker.execute("BEGIN")
    await blocker.execute("LOCK TABLE event_journal IN SHARE MODE")
    return blocker


async def _writer_waits(dsn: str) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND application_name LIKE 'slice-journal writer%' AND wait_event_type = 'Lock'"
            )
        )
    finally:
        await conn.close()


@pytest.mark.parametrize("back", ["within the check", "after the check"])
async def test_a_write_with_expected_seq_nr_is_unknown_only_while_the_database_stays_away(
    private_server: Any, back: str
) -> None:
    dsn = private_server.get_uri()
    await asyncio.to_thread(upgrade, dsn)
    quick = back == "after the check"
    retry = dict(attempts=3, max_backoff=0.1) if quick else dict(attempts=60, max_backoff=0.25)
    settings = JournalSettings.load(env={}, initial_backoff=0.05, connect_timeout=2.0, **retry)  # type: ignore[arg-type]
    async with open_journal(dsn, settings=settings) as j:
        await j.persist(PID, ["a"], expected_seq_nr=0)
        blocker = await _write_waiting_in_the_server(dsn)
        write = asyncio.create_task(j.persist(PID, ["b"], expected_seq_nr=1))
        await wait_until(lambda: _writer_waits(dsn), 20, "the write waiting in the server")
        await asyncio.to_thread(crash, private_server)  # the insert is rolled back with the server
        blocker.terminate()
        if quick:
            with pytest.raises(JournalUnavailable) as unknown:
                await write
            assert unknown.value.outcome_unknown  # the database stayed away for the whole check
            await asyncio.to_thread(private_server.ensure_postgres_running)
            with pytest.raises(JournalUnavailable) as resolved:
                await j.resolve_persist(PID, ["b"], expected_seq_nr=1)
            assert not resolved.value.outcome_unknown  # exact: known not stored
        else:
            await asyncio.to_thread(private_server.ensure_postgres_running)  # while the check retries
            (env,) = await write  # exact: known not stored, so sent again, and stored once
            assert env.seq_nr == 2
        assert [e.event async for e in j.current_events_by_persistence_id(PID)] == (["a"] if quick else ["a", "b"])
