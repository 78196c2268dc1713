"""Durable state upserts whose answer was lost (issue 34, faults): tests/support/relay.py cuts
the connection as the server answers; the store reads the row back once the server process has
settled and answers what happened, never a guess: written, a conflict with the revision another
writer took, or known not written (JournalUnavailable with outcome_unknown False)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from journal import DurableState, JournalSettings, JournalUnavailable, RevisionConflict, StateWritten, open_journal
from tests.conftest import truncate_all
from tests.support.relay import Relay, relay_to
from tests.support.waiting import wait_until


@pytest.fixture
async def relayed(dsn: str) -> AsyncIterator[tuple[Relay, DurableState]]:
    await truncate_all(dsn)
    async with relay_to(dsn) as relay:
        through = relay.dsn_through(dsn)
        settings = JournalSettings.load(
            env={}, dsn=through, attempts=6, initial_backoff=0.05, max_backoff=0.2, connect_timeout=1.0
        )
        async with open_journal(through, settings=settings, migrate=False) as j:
            store = j.durable_state()
            await store.upsert("Doc|warm", 1, {})  # a pooled connection that has prepared the upsert
            yield relay, store


async def _lose_the_next_answer(relay: Relay) -> None:
    """Lose the server's next answer (and its connection), then let the later ones through."""
    before = relay.lost_answers
    relay.losing = True
    await wait_until(lambda: relay.lost_answers > before, what="an answer lost")
    relay.losing = False


async def test_a_committed_upsert_whose_answer_was_lost_is_written(relayed: tuple[Relay, DurableState]) -> None:
    relay, store = relayed
    await store.upsert("Doc|a", 1, {"v": 1})
    losing = asyncio.create_task(_lose_the_next_answer(relay))
    written = await store.upsert("Doc|a", 2, {"v": 2})
    await losing
    assert type(written) is StateWritten and written.revision == 2
    got = await store.get("Doc|a")
    assert got is not None and (got.revision, got.value) == (2, {"v": 2})
    assert written.db_timestamp == got.db_timestamp
    await store.upsert("Doc|warm2", 1, {})  # the new connection prepares the statement: the answer lost is its run's
    outcomes = await _many_losing(relay, store, [("Doc|b", 1, {"v": 1}), ("Doc|a", 3, {"v": 3}), ("Doc|a2", 2, {})])
    assert [type(o) for o in outcomes] == [StateWritten, StateWritten, RevisionConflict], outcomes


async def _many_losing(relay: Relay, store: DurableState, parts: list[tuple[str, int, object]]) -> list[object]:
    losing = asyncio.create_task(_lose_the_next_answer(relay))
    outcomes = await store.upsert_many(parts)
    await losing
    return list(outcomes)


async def test_an_upsert_answered_then_its_connection_lost_on_release_is_written(
    relayed: tuple[Relay, DurableState],
) -> None:
    """The upsert's answer arrives; the answer to the pool's reset of its connection (sent on
    release) is lost: the upsert returns what was written. Before: asyncpg's
    ConnectionDoesNotExistError from the release replaced the outcome (seen in the fault run)."""
    relay, store = relayed
    relay.lose_after(1)
    written = await store.upsert("Doc|r", 1, {"v": 1})
    assert relay.lost_answers == 1
    got = await store.get("Doc|r")
    assert got is not None and (written.revision, got.revision, written.db_timestamp) == (1, 1, got.db_timestamp)


@pytest.mark.parametrize("taken", [2, 3])
async def test_an_upsert_lost_behind_another_writer_is_a_conflict_or_unknown(
    relayed: tuple[Relay, DurableState], dsn: str, taken: int
) -> None:
    """The row is locked by another writer; our upsert waits on it, that writer takes the
    revision (2: ours; 3: beyond), ours is refused and its answer lost: a RevisionConflict naming
    the revision, or, past ours, unknown (ours written then followed could look the same)."""
    relay, store = relayed
    await store.upsert("Doc|c", 1, {"v": 1})
    other = await asyncpg.connect(dsn)
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute("SELECT 1 FROM durable_state WHERE persistence_id = 'Doc|c' FOR UPDATE")
        ours = asyncio.create_task(store.upsert("Doc|c", 2, {"v": "ours"}))
        await wait_until(lambda: _waiting_on_a_lock(dsn), what="our upsert waiting on the row")
        relay.losing = True
        await other.execute("UPDATE durable_state SET revision = $1 WHERE persistence_id = 'Doc|c'", taken)
        await tx.commit()
        await wait_until(lambda: relay.lost_answers > 0, what="our answer lost")
        relay.losing = False
        if taken == 2:
            with pytest.raises(RevisionConflict) as e:
                await ours
            assert e.value.found == 2
        else:
            with pytest.raises(JournalUnavailable) as u:
                await ours
            assert u.value.outcome_unknown is True and "stored revision 3" in str(u.value)
    finally:
        await other.close()


async def test_an_upsert_that_died_before_its_commit_is_known_not_written(
    relayed: tuple[Relay, DurableState], dsn: str
) -> None:
    relay, store = relayed
    await store.upsert("Doc|d", 1, {"v": 1})
    other = await asyncpg.connect(dsn)
    try:
        tx = other.transaction()
        await tx.start()
        await other.execute("SELECT 1 FROM durable_state WHERE persistence_id = 'Doc|d' FOR UPDATE")
        ours = asyncio.create_task(store.upsert("Doc|d", 2, {"v": "ours"}))
        await wait_until(lambda: _waiting_on_a_lock(dsn), what="our upsert waiting on the row")
        relay.losing = True
        await other.execute(  # its server process dies before it commits
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE '%durable_state%'"
        )
        await tx.rollback()
        await wait_until(lambda: relay.lost_answers > 0, what="our answer lost")
        relay.losing = False
        with pytest.raises(JournalUnavailable) as e:
            await ours
        assert e.value.outcome_unknown is False and "not written" in str(e.value)
    finally:
        await other.close()
    got = await store.get("Doc|d")
    assert got is not None and (got.revision, got.value) == (1, {"v": 1})
    await store.upsert("Doc|d", 2, {"v": "again"})  # so it is safe to send again


async def _waiting_on_a_lock(dsn: str) -> bool:
    """Our upsert waits on the row's lock (asked on a connection of its own: pg_stat_activity
    is a snapshot for the length of a transaction)."""
    conn = await asyncpg.connect(dsn)
    try:
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%durable_state%'"
            )
        )
    finally:
        await conn.close()
