"""persist_many checks its later chunks while the server writes the earlier ones, inside
transactions committed only once every part was checked (journal/postgres/bulk_writes.py);
a call that fits one statement is that one statement (journal/group_commit.py).

Against a real PostgreSQL: rows of earlier chunks really were inserted before a bad part further
on was found, and none of them stays; a chunk refused by the database takes its transaction's
earlier chunks with it and they are all written again, alone where they fail; a connection
killed during COMMIT is resolved from the rows.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
from prometheus_client import REGISTRY

from journal import (
    InvalidArgument,
    Journal,
    JournalSettings,
    SerializationError,
    StorageError,
    Write,
    Written,
    failures,
)
from tests.support.rows import count_rows

MAX_BATCH_EVENTS = 1000
PARTS = 2000  # more than one statement holds: several chunks on each of the two bulk connections


@pytest.fixture
def settings(dsn: str) -> JournalSettings:
    return JournalSettings.load(env={}, dsn=dsn, max_batch_events=MAX_BATCH_EVENTS)


async def _count_inserts(dsn: str) -> asyncpg.Connection:
    """A trigger that counts every row inserted into event_journal with a sequence (sequences do
    not roll back: the count includes rows of transactions that did)."""
    conn = await asyncpg.connect(dsn)
    await conn.execute(
        """CREATE SEQUENCE bulk_rows_seen;
           CREATE FUNCTION count_bulk_row() RETURNS trigger AS $$
           BEGIN PERFORM nextval('bulk_rows_seen'); RETURN NEW; END $$ LANGUAGE plpgsql;
           CREATE TRIGGER count_bulk_row BEFORE INSERT ON event_journal
             FOR EACH ROW EXECUTE FUNCTION count_bulk_row();"""
    )
    return conn


async def _drop_counter(conn: asyncpg.Connection) -> None:
    await conn.execute(
        "DROP TRIGGER IF EXISTS count_bulk_row ON event_journal; DROP FUNCTION IF EXISTS count_bulk_row(); "
        "DROP SEQUENCE IF EXISTS bulk_rows_seen"
    )
    await conn.close()


async def _seen(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM bulk_rows_seen"))


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (Write("late|bad", [object()], 0), SerializationError, f"part {PARTS - 5}"),
        (Write("late|1", ["again"], 0), InvalidArgument, f"part {PARTS - 5}: 'late|1' appears in an earlier part"),
        (Write("", ["x"]), InvalidArgument, f"part {PARTS - 5}: persistence id must not be empty"),
    ],
)
async def test_a_bad_part_in_a_late_chunk_leaves_nothing_of_the_chunks_already_written(
    dsn: str, journal: Journal, bad: Write, error: type[Exception], message: str
) -> None:
    counter = await _count_inserts(dsn)
    try:
        writes = [Write(f"late|{i}", [{"n": i}], 0) for i in range(PARTS)]
        writes[PARTS - 5] = bad
        with pytest.raises(error, match=message):
            await journal.persist_many(writes)
        assert await _seen(counter) >= 500  # earlier chunks were inserted before the bad part was found ...
        assert await count_rows(dsn) == 0  # ... and rolled back
        out = await journal.persist_many([Write(f"late|{i}", [{"n": i}], 0) for i in range(PARTS)])
        assert failures(out) == [] and await count_rows(dsn) == PARTS  # nothing of the failed call was left behind
    finally:
        await _drop_counter(counter)


async def test_a_refused_chunk_takes_its_transaction_down_and_every_call_is_written_again(
    dsn: str, journal: Journal
) -> None:
    """A trigger refuses one row in the third chunk: the transaction that held the first chunk
    rolls back with it; both are written again, and only the refused call fails."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """CREATE FUNCTION refuse_one() RETURNS trigger AS $$
               BEGIN IF NEW.persistence_id = 'ref|1200' THEN RAISE EXCEPTION 'refused by a trigger'; END IF;
               RETURN NEW; END $$ LANGUAGE plpgsql;
               CREATE TRIGGER refuse_one BEFORE INSERT ON event_journal FOR EACH ROW EXECUTE FUNCTION refuse_one();"""
        )
        out = await journal.persist_many([(f"ref|{i}", [i]) for i in range(PARTS)])
        assert [i for i, _ in failures(out)] == [1200]
        assert isinstance(out[1200], StorageError) and "refused by a trigger" in str(out[1200])
        assert all(isinstance(o, Written) and o.first_seq_nr == 1 for i, o in enumerate(out) if i != 1200)
        assert await count_rows(dsn) == PARTS - 1
        assert int(await conn.fetchval("SELECT count(DISTINCT persistence_id) FROM event_journal")) == PARTS - 1
    finally:
        await conn.execute("DROP TRIGGER IF EXISTS refuse_one ON event_journal; DROP FUNCTION IF EXISTS refuse_one()")
        await conn.close()


async def test_a_connection_killed_during_commit_is_resolved_from_the_rows(dsn: str, journal: Journal) -> None:
    """A deferred trigger holds the COMMIT of the bulk transactions; one of their server
    processes is terminated there (its transaction aborts): its calls are found not written and
    written again, the other connection's commit stands, and every call ends written once."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """CREATE FUNCTION slow_commit() RETURNS trigger AS $$
               BEGIN IF NOT EXISTS (SELECT 1 FROM pg_class WHERE relname = 'commit_done') THEN PERFORM pg_sleep(5);
               END IF; RETURN NULL; END $$ LANGUAGE plpgsql;
               CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON event_journal DEFERRABLE INITIALLY DEFERRED
                 FOR EACH ROW WHEN (NEW.persistence_id = 'kc|0') EXECUTE FUNCTION slow_commit();"""
        )
        task = asyncio.create_task(journal.persist_many([Write(f"kc|{i}", [i], 0) for i in range(PARTS)]))
        deadline = time.monotonic() + 10
        while True:  # the COMMIT that runs the deferred trigger
            pid = await conn.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' "
                "AND application_name LIKE 'slice-journal writer%' AND query = 'COMMIT'"
            )
            if pid is not None:
                break
            assert time.monotonic() < deadline, "no bulk COMMIT seen"
            await asyncio.sleep(0.01)
        await conn.execute("CREATE TABLE commit_done ()")  # the calls written again do not wait
        assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
        out = await asyncio.wait_for(task, 30)
        assert failures(out) == []
        assert await count_rows(dsn) == PARTS
        assert int(await conn.fetchval("SELECT count(*) FROM event_journal WHERE seq_nr <> 1")) == 0
    finally:
        await conn.execute(
            "DROP TRIGGER IF EXISTS slow_commit ON event_journal; DROP FUNCTION IF EXISTS slow_commit(); "
            "DROP TABLE IF EXISTS commit_done"
        )
        await conn.close()


async def test_a_call_that_fits_one_statement_is_checked_whole_and_written_without_transactions(
    dsn: str, journal: Journal
) -> None:
    """Up to ``max_batch_events`` parts: checked whole, then one statement per bulk connection
    (``bulk_in_flight``, 2), written at once as group-commit batches are, no transaction held
    open (before: four chunks of 250 in two transactions). Bad input still writes nothing."""

    def statements() -> float:
        return REGISTRY.get_sample_value("journal_write_batch_calls_count") or 0.0

    before = statements()
    out = await journal.persist_many([Write(f"one|{i}", [i], 0) for i in range(MAX_BATCH_EVENTS)])
    assert failures(out) == [] and await count_rows(dsn) == MAX_BATCH_EVENTS
    assert all(isinstance(o, Written) and o.first_seq_nr == o.last_seq_nr == 1 for o in out)
    assert statements() - before == 2
    with pytest.raises(InvalidArgument, match=f"part {MAX_BATCH_EVENTS - 1}"):
        await journal.persist_many([Write(f"two|{i}", [i]) for i in range(MAX_BATCH_EVENTS - 1)] + [Write("", [1])])
    assert statements() - before == 2 and await count_rows(dsn) == MAX_BATCH_EVENTS
