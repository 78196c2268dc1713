"""Outages: bounded retries, a typed JournalUnavailable, and exact resolution of interrupted writes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import asyncpg
import pytest

from journal import ConfigurationError, Journal, JournalSettings, JournalUnavailable, open_journal
from tests.support.waiting import wait_until


async def test_unreachable_database_is_a_typed_error_after_bounded_retries() -> None:
    settings = JournalSettings.load(env={}, attempts=3, initial_backoff=0.01, connect_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(JournalUnavailable, match=r"127\.0\.0\.1:1/none: connection refused .*\(3 attempts in"):
        async with open_journal("postgresql://postgres@127.0.0.1:1/none", settings=settings):
            pass
    assert time.monotonic() - started < 10


async def test_not_a_postgres_dsn() -> None:
    with pytest.raises(ConfigurationError, match="not a PostgreSQL DSN"):
        async with open_journal("mysql://x/y", settings=JournalSettings.load(env={})):
            pass


async def _kill_writers(dsn: str, stop: asyncio.Event) -> int:
    """Terminate the journal's pooled connections while they write (a real lost connection)."""
    admin = await asyncpg.connect(dsn)
    killed = 0
    try:
        while not stop.is_set():
            killed += await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND application_name LIKE 'slice-journal writer%' AND state = 'active'"
            )
            await asyncio.sleep(0.005)  # the adversary's pace (not a wait for a condition)
    finally:
        await admin.close()
    return killed


async def test_interrupted_writes_with_expected_seq_nr_are_resolved_exactly(dsn: str, journal: Journal) -> None:
    """Writers keep losing their connections mid-statement; every call ends known, none twice."""
    setup = await asyncpg.connect(dsn)
    await setup.execute(  # each insert stays active for a few ms, so the killer reliably meets some
        """CREATE OR REPLACE FUNCTION flaky_slow() RETURNS trigger AS $$
           BEGIN PERFORM pg_sleep(0.003); RETURN NEW; END $$ LANGUAGE plpgsql;
           CREATE TRIGGER flaky_slow BEFORE INSERT ON event_journal FOR EACH STATEMENT EXECUTE FUNCTION flaky_slow();"""
    )
    stop = asyncio.Event()
    killer = asyncio.create_task(_kill_writers(dsn, stop))
    outcomes: dict[str, int] = {}

    async def entity(i: int) -> None:
        pid = f"flaky|{i}"
        seq = 0
        for k in range(15):
            try:
                envs = await journal.persist(pid, [{"k": k}, {"k2": k}], expected_seq_nr=seq)
                seq = envs[-1].seq_nr
            except JournalUnavailable as e:
                assert not e.outcome_unknown, e
                seq = await journal.highest_seq_nr(pid)
        outcomes[pid] = seq

    try:
        await asyncio.gather(*(entity(i) for i in range(20)))
    finally:
        stop.set()
        killed = await killer
        await setup.execute("DROP TRIGGER IF EXISTS flaky_slow ON event_journal; DROP FUNCTION IF EXISTS flaky_slow()")
        await setup.close()
    for pid, seq in outcomes.items():
        stored = [e.event async for e in journal.current_events_by_persistence_id(pid)]
        assert len(stored) == seq
        # pairs stay together and no call was written twice
        ks = [ev["k"] for ev in stored[::2]]
        assert ks == sorted(set(ks))
        assert all(stored[2 * n + 1] == {"k2": stored[2 * n]["k"]} for n in range(len(stored) // 2))
    assert killed > 0, "no write was interrupted: the test proved nothing"


async def test_writes_without_expected_seq_nr_report_unknown_outcome(dsn: str, journal: Journal) -> None:
    """With nothing to check against, an interrupted write says so instead of guessing."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """CREATE FUNCTION slow_insert() RETURNS trigger AS $$
               BEGIN IF NEW.persistence_id = 'slow|1' THEN PERFORM pg_sleep(5); END IF; RETURN NEW; END $$
               LANGUAGE plpgsql;
               CREATE TRIGGER slow BEFORE INSERT ON event_journal FOR EACH ROW EXECUTE FUNCTION slow_insert();"""
        )
        task = asyncio.create_task(journal.persist("slow|1", ["x"]))

        async def kill_the_insert() -> int:  # once it runs (inside the slow trigger)
            return int(
                await conn.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND application_name LIKE 'slice-journal writer%' AND state = 'active' AND pid <> pg_backend_pid()"
                )
            )

        await wait_until(kill_the_insert, 10, "the INSERT to run (then terminated)", every=0.01)
        with pytest.raises(JournalUnavailable) as err:
            await task
        assert err.value.outcome_unknown
    finally:
        await conn.execute("DROP TRIGGER IF EXISTS slow ON event_journal; DROP FUNCTION IF EXISTS slow_insert()")
        await conn.close()


async def test_embedded_postgres_is_created_and_migrated_on_first_use(tmp_path: Path) -> None:
    settings = JournalSettings.load(env={}, data_dir=tmp_path / "pgdata")
    async with open_journal(settings=settings) as j:
        await j.persist("emb|1", ["hello"])
        assert [e.event async for e in j.current_events_by_persistence_id("emb|1")] == ["hello"]
    assert (tmp_path / "pgdata" / "PG_VERSION").exists()
    async with open_journal(settings=settings) as j:  # reused, data still there
        assert await j.highest_seq_nr("emb|1") == 1


async def test_a_write_still_running_on_the_server_is_waited_for_not_resent(dsn: str, journal: Journal) -> None:
    """The client loses its connection while the server is still executing the insert (which then
    commits). Reading the rows at once would say "not written" and resend into a conflict; the
    journal waits for the server process to finish, so the caller learns the write succeeded."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """CREATE FUNCTION slow_insert2() RETURNS trigger AS $$
               BEGIN IF NEW.persistence_id = 'late|1' THEN PERFORM pg_sleep(1); END IF; RETURN NEW; END $$
               LANGUAGE plpgsql;
               CREATE TRIGGER slow2 BEFORE INSERT ON event_journal FOR EACH ROW EXECUTE FUNCTION slow_insert2();"""
        )
        await journal.persist("late|1", ["first"])  # slow, but on an intact connection
        task = asyncio.create_task(journal.persist("late|1", ["second"], expected_seq_nr=1))
        app = journal.backend.writers.application_name  # type: ignore[attr-defined]

        async def writing() -> bool:
            active = "SELECT 1 FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'"
            return bool(await conn.fetchval(active, app))

        await wait_until(writing, 10, "the second write to run on the server", every=0.01)
        for c in list(journal.backend.writers._all):  # type: ignore[attr-defined]
            c.terminate()  # the client side goes away; the server keeps executing and commits
        envs = await asyncio.wait_for(task, 30)
        assert [e.seq_nr for e in envs] == [2]
        assert [e.event async for e in journal.current_events_by_persistence_id("late|1")] == ["first", "second"]
    finally:
        await conn.execute("DROP TRIGGER IF EXISTS slow2 ON event_journal; DROP FUNCTION IF EXISTS slow_insert2()")
        await conn.close()
