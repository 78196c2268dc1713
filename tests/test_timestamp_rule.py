"""``journal timestamp-rule``: the database stamps foreign writers' rows after the table lock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import asyncpg

from journal import Journal, JournalSettings, open_journal, slice_for
from journal.postgres import timestamp_rule

FOREIGN_INSERT = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
  event_ser_manifest, event_payload, writer)
VALUES ($1, 'Foreign', $2, $3, transaction_timestamp(), 1, '', '{}'::bytea, 'jvm') RETURNING db_timestamp"""


async def test_rule_stamps_foreign_rows_and_skips_the_journals_own(journal: Journal, dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await timestamp_rule.install(conn)
        await timestamp_rule.install(conn)  # idempotent
        assert await timestamp_rule.installed(conn)
        # a foreign writer stamping at transaction start: the rule raises it past the statement's lock
        async with conn.transaction():
            started = await conn.fetchval("SELECT transaction_timestamp()")
            await conn.execute("SELECT pg_sleep(0.05)")
            pid = "Foreign|f-1"
            stamped = await conn.fetchval(FOREIGN_INSERT, slice_for(pid), pid, 1)
        assert stamped > started
        # this library's own writes obey the rule already: untouched (one microsecond per row)
        written = await journal.persist("Own|o-1", [{"n": 1}, {"n": 2}, {"n": 3}])
        stored = await conn.fetch(
            "SELECT db_timestamp FROM event_journal WHERE persistence_id = 'Own|o-1' ORDER BY seq_nr"
        )
        assert [r[0] for r in stored] == [e.db_timestamp for e in written]
        # persist_in inside the caller's transaction: skipped too
        async with conn.transaction():
            mine = await journal.persist_in(conn, "Own|o-2", [{"n": 1}, {"n": 2}])
        stored = await conn.fetch(
            "SELECT db_timestamp FROM event_journal WHERE persistence_id = 'Own|o-2' ORDER BY seq_nr"
        )
        assert [r[0] for r in stored] == [e.db_timestamp for e in mine]
        await timestamp_rule.remove(conn)
        assert not await timestamp_rule.installed(conn)
        async with conn.transaction():
            started = await conn.fetchval("SELECT transaction_timestamp()")
            stamped = await conn.fetchval(FOREIGN_INSERT, slice_for("Foreign|f-2"), "Foreign|f-2", 1)
        assert stamped == started, "without the rule a foreign row keeps its transaction-start stamp"
    finally:
        await timestamp_rule.remove(conn)
        await conn.close()


def test_cli_installs_reports_and_removes_the_rule(dsn: str) -> None:
    cli = str(Path(sys.executable).parent / "journal")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([cli, "timestamp-rule", *args, "--dsn", dsn], capture_output=True, text=True, timeout=60)

    assert "timestamp rule installed" in run("install").stdout
    assert "timestamp rule installed" in run("status").stdout
    assert "not installed" in run("remove").stdout
    bad = run("enable")
    assert bad.returncode == 2 and "install, remove or status" in bad.stderr


FOREIGN_TAGGED = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
  event_ser_manifest, event_payload, writer, tags)
SELECT $1, 'Foreign', $2, s, transaction_timestamp(), 1, '', convert_to('{"n": ' || s || '}', 'UTF8'), 'jvm', $4
  FROM generate_series(1, $3) s"""


async def test_rule_writes_the_tag_rows_of_foreign_tagged_events(journal: Journal, dsn: str) -> None:
    """A foreign writer (as the plugin: tags on its event rows, no tag view) is seen by
    events_by_tag with the rule installed; the journal's own tagged writes are not doubled.
    Before: events_by_tag never saw them."""
    conn = await asyncpg.connect(dsn)
    fast = JournalSettings.load(env={}, dsn=dsn, eventual_consistency_delay=0.0)
    try:
        await timestamp_rule.install(conn)
        async with open_journal(dsn, settings=fast) as j:
            for pid in ("Foreign|t-1", "Foreign|t-2"):
                await conn.execute(FOREIGN_TAGGED, slice_for(pid), pid, 3, ["blue", "green"])
            await conn.execute(FOREIGN_TAGGED, slice_for("Foreign|t-3"), "Foreign|t-3", 2, None)  # untagged
            await j.persist("Own|t-4", [{"n": 1}, {"n": 2}], tags=["blue"])
            blue = [(e.persistence_id, e.seq_nr, e.event) async for e in j.current_events_by_tag("blue")]
            foreign = {(p, s) for p in ("Foreign|t-1", "Foreign|t-2") for s in (1, 2, 3)}
            assert {(p, s) for p, s, _ in blue} == foreign | {("Own|t-4", 1), ("Own|t-4", 2)}
            assert len(blue) == 8 and all(e == {"n": s} for _, s, e in blue)
            green = [(e.persistence_id, e.seq_nr) async for e in j.current_events_by_tag("green")]
            assert sorted(green) == sorted(foreign)
            numbers = await conn.fetch(
                "SELECT persistence_id, array_agg(tag_pid_sequence_nr ORDER BY sequence_nr) FROM tag_views "
                "WHERE tag_name = 'blue' GROUP BY 1"
            )
            assert {r[0]: r[1] for r in numbers} == {
                "Foreign|t-1": [1, 2, 3], "Foreign|t-2": [1, 2, 3], "Own|t-4": [1, 2],
            }  # fmt: skip
            await timestamp_rule.remove(conn)
            await conn.execute(FOREIGN_TAGGED, slice_for("Foreign|t-5"), "Foreign|t-5", 1, ["blue"])
            assert not [e async for e in j.current_events_by_tag("blue") if e.persistence_id == "Foreign|t-5"]
    finally:
        await timestamp_rule.remove(conn)
        await conn.close()
