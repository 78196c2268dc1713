"""Durable state in the operations tools (issue 34, item 5): ``journal info`` counts the
``durable_state`` rows and ``journal cleanup delete-state-tombstones --before`` removes the
tombstones written before a time, and only those (the real commands, as subprocesses)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import timedelta

import pytest

from journal import InvalidArgument, Journal
from tests.conftest import truncate_all

JOURNAL = [sys.executable, "-m", "journal"]


def journal_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*JOURNAL, *args], capture_output=True, text=True, timeout=120)


async def test_info_counts_states_and_cleanup_deletes_old_tombstones_only(journal: Journal, dsn: str) -> None:
    await truncate_all(dsn)
    store = journal.durable_state()
    for pid in ("Doc|old-1", "Doc|old-2", "Doc|kept", "Doc|new"):
        await store.upsert(pid, 1, {"pid": pid})
    await store.delete("Doc|old-1", 2)
    last_old = await store.delete("Doc|old-2", 2)
    before = last_old.db_timestamp + timedelta(microseconds=1)
    await store.delete("Doc|new", 2)  # after the cut-off: kept

    info = await asyncio.to_thread(journal_cli, "info", "--dsn", dsn)
    assert info.returncode == 0, info.stderr
    assert "durable states:  4 (3 of them deleted: tombstones)" in info.stdout

    dry = await asyncio.to_thread(
        journal_cli, "cleanup", "delete-state-tombstones", "--before", before.isoformat(), "--dry-run", "--dsn", dsn
    )
    assert dry.returncode == 0, dry.stderr
    assert "would delete 2 durable state tombstones" in dry.stdout
    assert (await store.get("Doc|old-1")) is not None

    done = await asyncio.to_thread(
        journal_cli, "cleanup", "delete-state-tombstones", "--before", before.isoformat(), "--dsn", dsn
    )
    assert done.returncode == 0, done.stderr
    assert "deleted 2 durable state tombstones" in done.stdout
    assert await store.get("Doc|old-1") is None and await store.get("Doc|old-2") is None
    new = await store.get("Doc|new")
    assert new is not None and new.deleted and new.revision == 2
    kept = await store.get("Doc|kept")
    assert kept is not None and kept.value == {"pid": "Doc|kept"}
    await store.upsert("Doc|old-1", 1, {"again": True})  # no row: its revisions start again
    again = await asyncio.to_thread(
        journal_cli, "cleanup", "delete-state-tombstones", "--before", before.isoformat(), "--dsn", dsn
    )
    assert "deleted 0 durable state tombstones" in again.stdout


@pytest.mark.parametrize(
    ("before", "says"),
    [("yesterday", "not an ISO 8601 time"), ("2026-11-01T00:00:00", "give a timezone")],
)
def test_a_bad_time_is_one_line_and_exit_2(dsn: str, before: str, says: str) -> None:
    r = journal_cli("cleanup", "delete-state-tombstones", "--before", before, "--dsn", dsn)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


async def test_the_store_refuses_a_naive_time(journal: Journal) -> None:
    from datetime import datetime

    with pytest.raises(InvalidArgument, match="timezone-aware"):
        await journal.durable_state().delete_tombstones(datetime(2026, 1, 1))
