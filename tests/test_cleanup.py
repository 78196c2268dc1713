"""The cleanup tool (journal.cleanup and ``journal cleanup``), on PostgreSQL and on the session's
Cassandra (``CASSANDRA_CONTACT_POINTS`` or a local node: see cassandra_fixtures.py).

Each test dumps every table of the journal before and after and checks that the rows of other
persistence ids (events, snapshots, tag rows, tag progress, metadata) are exactly as they were.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from cassandra_fixtures import recent_first_bucket
from conftest import truncate_all
from typer.testing import CliRunner

from journal import Journal, open_journal
from journal.cleanup import Cleanup, CleanupAction, PidResult, read_pids
from journal.cli import app
from journal.errors import InvalidArgument
from journal.settings import JournalSettings

VICTIMS = ["Cart|v1", "Cart|v2"]
BYSTANDERS = ["Cart|b1", "Order|b2"]
TAGS = ("t1", "t2")

Dump = dict[str, set[tuple[Any, ...]]]


@dataclass
class Env:
    """An open journal on one backend, its target, and a dump of every table it uses."""

    kind: str
    target: str
    journal: Journal
    dump: Callable[[], Awaitable[Dump]]
    pid_column: dict[str, int]
    """Per table: the position of the persistence id in its rows."""
    settings: JournalSettings
    columns: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Per Cassandra table: its column names, in the order of the dumped rows."""


def _value(v: Any) -> Any:
    """Lists, sets and maps (the driver's SortedSet and OrderedMap too) as sorted tuples."""
    if isinstance(v, str | bytes) or not hasattr(v, "__iter__"):
        return v
    if hasattr(v, "items"):
        return tuple(sorted(v.items()))
    return tuple(sorted(v))


def _hashable(row: Any) -> tuple[Any, ...]:
    return tuple(_value(v) for v in row)


async def _postgres_dump(dsn: str) -> Dump:
    tables = ["event_journal", "snapshot", "tag_views", "tag_write_progress", "tag_scanning", "tag_view_settings"]
    conn = await asyncpg.connect(dsn)
    try:
        return {t: {_hashable(r) for r in await conn.fetch(f"SELECT * FROM {t}")} for t in tables}
    finally:
        await conn.close()


async def _postgres_columns(dsn: str) -> dict[str, tuple[str, ...]]:
    """Per table: its column names in the order of ``SELECT *``."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 'public' ORDER BY table_name, ordinal_position"
        )
    finally:
        await conn.close()
    out: dict[str, tuple[str, ...]] = {}
    for r in rows:
        out[r[0]] = (*out.get(r[0], ()), r[1])
    return out


CASSANDRA_TABLES = [
    "messages", "snapshots", "tag_views", "tag_write_progress", "tag_scanning", "metadata", "all_persistence_ids",
]  # fmt: skip


async def _cassandra_env(target: str, session: Any) -> AsyncIterator[Env]:
    """A journal on the session's Cassandra keyspace (empty tables) and a dump of its tables."""
    ks = target.rsplit("/", 1)[1]
    pid_column: dict[str, int] = {}

    async def dump() -> Dump:
        out: Dump = {}
        for t in CASSANDRA_TABLES:
            rows = list(await asyncio.to_thread(session.execute, f"SELECT * FROM {ks}.{t}"))
            if rows:
                pid_column[t] = rows[0]._fields.index("persistence_id")
                columns[t] = tuple(rows[0]._fields)
            out[t] = {_hashable(r) for r in rows}
        return out

    settings = JournalSettings.load(env={}, eventual_consistency_delay=0.0, first_time_bucket=recent_first_bucket())
    columns: dict[str, tuple[str, ...]] = {}
    async with open_journal(target, settings=settings) as j:
        yield Env("cassandra", target, j, dump, pid_column, settings, columns)


@pytest.fixture(params=["postgres", pytest.param("cassandra", marks=pytest.mark.cassandra)])
def backend_target(request: pytest.FixtureRequest) -> tuple[str, str, Any]:
    """(kind, the session's PostgreSQL DSN or a Cassandra keyspace's, a Cassandra driver session),
    resolved outside the loop."""
    if request.param == "cassandra":
        return "cassandra", str(request.getfixturevalue("cassandra_dsn")), request.getfixturevalue("cassandra_session")
    return "postgres", str(request.getfixturevalue("dsn")), None


@pytest.fixture
async def env(backend_target: tuple[str, str, Any]) -> AsyncIterator[Env]:
    kind, dsn, session = backend_target
    if kind == "cassandra":
        async for e in _cassandra_env(dsn, session):
            yield e
        return
    settings = JournalSettings.load(env={}, dsn=dsn, eventual_consistency_delay=0.0)
    await truncate_all(dsn)
    columns = await _postgres_columns(dsn)
    pid_column = {t: c.index("persistence_id") for t, c in columns.items() if "persistence_id" in c}
    async with open_journal(dsn, settings=settings) as j:
        yield Env("postgres", dsn, j, lambda: _postgres_dump(dsn), pid_column, settings, columns)


async def _populate(env: Env) -> None:
    """Every pid: 3 untagged events, 2 events tagged t1 and t2, a snapshot at 3 (not v2, b2), tag
    writer progress and scanning rows (v1 and b1)."""
    j = env.journal
    for pid in VICTIMS + BYSTANDERS:
        await j.persist(pid, [{"n": 1}, {"n": 2}, {"n": 3}])
        await j.persist(pid, [{"n": 4}, {"n": 5}], tags=TAGS)
    for pid in ("Cart|v1", "Cart|b1"):
        await j.save_snapshot(pid, 3, {"state": pid})
    store = j.backend.tag_store()  # type: ignore[attr-defined]
    from journal.backend import TagProgress

    for pid in ("Cart|v1", "Cart|b1"):
        offset = next(iter(await store.tagged_events(pid, 4, 1))).timeuuid
        await store.write_progress([TagProgress(pid, "t1", 5, 2, offset)])
        await store.write_scanning(pid, 5)


def _split(env: Env, dump: Dump, pids: list[str]) -> tuple[Dump, Dump]:
    """(rows of ``pids``, rows of every other pid) per table."""
    mine: Dump = {}
    others: Dump = {}
    for table, rows in dump.items():
        col = env.pid_column.get(table)
        mine[table] = {r for r in rows if col is not None and r[col] in pids}
        others[table] = rows - mine[table]
    return mine, others


async def _events(env: Env, pid: str) -> list[int]:
    return [e.seq_nr async for e in env.journal.current_events_by_persistence_id(pid)]


async def _tag_pids(env: Env, tag: str) -> list[tuple[str, int]]:
    return [(e.persistence_id, e.seq_nr) async for e in env.journal.current_events_by_tag(tag)]


def _column(env: Env, table: str, name: str) -> int:
    return env.columns[table].index(name)


async def _progress(env: Env, pids: list[str]) -> set[tuple[str, int, int]]:
    """(pid, tag, tag_pid_sequence_nr) of the tag writer progress rows of ``pids``."""
    rows = (await env.dump())["tag_write_progress"]
    pid, tag, n = (_column(env, "tag_write_progress", c) for c in ("persistence_id", "tag", "tag_pid_sequence_nr"))
    return {(r[pid], r[tag], r[n]) for r in rows if r[pid] in pids}


async def _tag_numbers(env: Env, persistence_id: str) -> list[tuple[str, int]]:
    rows = (await env.dump())["tag_views"]
    pid, tag, n = (_column(env, "tag_views", c) for c in ("persistence_id", "tag_name", "tag_pid_sequence_nr"))
    return sorted((r[tag], r[n]) for r in rows if r[pid] == persistence_id)


async def _check_deleted_all(env: Env, before: Dump, *, reset: bool) -> None:
    after = await env.dump()
    _, others_before = _split(env, before, VICTIMS)
    mine_after, others_after = _split(env, after, VICTIMS)
    assert others_after == others_before, "rows of other persistence ids changed"
    for pid in VICTIMS:
        assert await _events(env, pid) == []
        assert await env.journal.load_snapshot(pid) is None
        assert await env.journal.highest_seq_nr(pid) == (0 if reset else 5)
    for tag in TAGS:
        assert {p for p, _ in await _tag_pids(env, tag)} == set(BYSTANDERS)
    for table in ("snapshot", "snapshots", "tag_views", *(("tag_write_progress", "tag_scanning") if reset else ())):
        assert not mine_after.get(table), f"{table} still has rows of the deleted pids"
    if not reset:  # progress kept at the deleted rows' numbers: each tag's numbering goes on after 2
        assert await _progress(env, VICTIMS) == {(pid, tag, 2) for pid in VICTIMS for tag in TAGS}
    if env.kind == "postgres":
        tombstones = {(r[2], r[3], r[8]) for r in mine_after["event_journal"]}
        assert tombstones == (set() if reset else {(pid, 5, True) for pid in VICTIMS})
    else:
        # a non-reset delete may keep a partition's static columns (no event rows); a reset none
        seq = env.columns["messages"].index("sequence_nr")
        assert not [r for r in mine_after["messages"] if reset or r[seq] is not None]
        kept = {r[env.pid_column["all_persistence_ids"]] for r in mine_after["all_persistence_ids"]}
        assert kept == (set() if reset else set(VICTIMS))
        deleted_to = {(r[env.pid_column["metadata"]], r[1]) for r in mine_after["metadata"]}
        assert deleted_to == (set() if reset else {(pid, 5) for pid in VICTIMS})
    # the entity started again (a fresh journal): continues after the kept highest number, or at 1,
    # and so do its tag numbers (a consumer that saw 1 and 2 would drop them as duplicates)
    async with open_journal(env.target, settings=env.settings) as fresh:
        written = await fresh.persist("Cart|v1", [{"n": "again"}], tags=["t1"])
        assert written[0].seq_nr == (1 if reset else 6)
        tagged = [e async for e in fresh.current_events_by_tag("t1") if e.persistence_id == "Cart|v1"]
    assert [e.seq_nr for e in tagged] == [written[0].seq_nr]
    assert await _tag_numbers(env, "Cart|v1") == [("t1", 1 if reset else 3)]


@pytest.mark.parametrize("reset", [False, True])
async def test_delete_all_touches_only_the_given_pids(env: Env, reset: bool) -> None:
    await _populate(env)
    before = await env.dump()
    results = await Cleanup(env.journal.backend).delete_all(VICTIMS, reset_seq_nr=reset)
    assert [r.persistence_id for r in results] == VICTIMS
    assert results[0].before.events == 5 and results[0].before.tag_rows == 4
    assert results[0].before.snapshot_seq_nr == 3 and results[1].before.snapshot_seq_nr is None
    assert results[0].after is not None and results[0].after.tag_rows == 0
    await _check_deleted_all(env, before, reset=reset)


async def test_delete_snapshots_deletes_only_snapshots(env: Env) -> None:
    await _populate(env)
    before = await env.dump()
    results = await Cleanup(env.journal.backend).delete_snapshots(VICTIMS)
    assert [r.after.snapshot_seq_nr if r.after else -1 for r in results] == [None, None]
    after = await env.dump()
    changed = {t for t in before if before[t] != after[t]}
    assert changed == {"snapshot" if env.kind == "postgres" else "snapshots"}
    _, others_before = _split(env, before, VICTIMS)
    _, others_after = _split(env, after, VICTIMS)
    assert others_after == others_before
    assert await env.journal.load_snapshot("Cart|v1") is None
    assert await env.journal.load_snapshot("Cart|b1") is not None
    assert await _events(env, "Cart|v1") == [1, 2, 3, 4, 5]


async def test_delete_before_snapshot_keeps_later_events_and_tag_rows(env: Env) -> None:
    await _populate(env)
    before = await env.dump()
    results = await Cleanup(env.journal.backend).delete_events_before_snapshot(VICTIMS)
    assert results[0].skipped is None and results[1].skipped == "no snapshot"
    assert await _events(env, "Cart|v1") == [4, 5]
    assert await _events(env, "Cart|v2") == [1, 2, 3, 4, 5]
    assert (await env.journal.load_snapshot("Cart|v1")) is not None
    assert ("Cart|v1", 4) in await _tag_pids(env, "t1")
    after = await env.dump()
    _, others_before = _split(env, before, ["Cart|v1"])
    _, others_after = _split(env, after, ["Cart|v1"])
    assert others_after == others_before, "only Cart|v1's events may change"
    tag_table = "tag_views"
    assert after[tag_table] == before[tag_table]


async def test_dry_run_deletes_nothing_and_reports(env: Env) -> None:
    await _populate(env)
    before = await env.dump()
    predicted = {  # (events, tag rows, snapshot) a real run would leave (pids without a snapshot are skipped)
        CleanupAction.DELETE_ALL: [(0, 0, None)] * 3,
        CleanupAction.DELETE_SNAPSHOTS: [(5, 4, None), (5, 4, None), (0, 0, None)],
        CleanupAction.DELETE_BEFORE_SNAPSHOT: [(2, 4, 3), (5, 4, None), (0, 0, None)],
    }
    for action in CleanupAction:
        results = await Cleanup(env.journal.backend, dry_run=True).run(action, [*VICTIMS, "Cart|never"])
        after = [(r.after.events, r.after.tag_rows, r.after.snapshot_seq_nr) for r in results if r.after]
        assert after == predicted[action]
        assert [(r.before.events, r.before.tag_rows, r.before.snapshot_seq_nr) for r in results] == [
            (5, 4, 3), (5, 4, None), (0, 0, None)
        ]  # fmt: skip
    assert await env.dump() == before


@pytest.mark.parametrize("action", list(CleanupAction))
async def test_a_dry_run_predicts_what_the_real_run_leaves(env: Env, action: CleanupAction) -> None:
    """ "would delete N" must be what the real run then deletes (it counted a kept tombstone row)."""
    await _populate(env)
    await env.journal.delete_events_to("Cart|v2", 2)  # earlier deletes: a tombstone row on Postgres
    dry = await Cleanup(env.journal.backend, dry_run=True).run(action, VICTIMS)
    real = await Cleanup(env.journal.backend).run(action, VICTIMS)
    assert [r.after for r in dry] == [r.after for r in real]
    assert [r.before for r in dry] == [r.before for r in real]


@pytest.mark.parametrize("reset", [False, True])
async def test_interrupted_cleanup_finishes_when_run_again(env: Env, reset: bool) -> None:
    await _populate(env)
    before = await env.dump()
    tool = Cleanup(env.journal.backend)

    class Interrupted(Exception):
        pass

    def stop_after_first(r: PidResult) -> None:
        raise Interrupted(r.persistence_id)

    with pytest.raises(Interrupted):
        await tool.delete_all(VICTIMS, reset_seq_nr=reset, on_done=stop_after_first)
    # the second pid was interrupted half-way: its tag rows are gone, then (reset) its events
    # too but the pid not yet forgotten; its snapshot is still there
    await tool.store.delete_tag_rows("Cart|v2", keep_numbering=not reset)
    if reset:
        await tool.store.delete_all_events("Cart|v2", reset_seq_nr=False)
        assert await _events(env, "Cart|v2") == [] and await env.journal.highest_seq_nr("Cart|v2") == 5
    else:
        assert await _events(env, "Cart|v2") == [1, 2, 3, 4, 5]
    again = await tool.delete_all(VICTIMS, reset_seq_nr=reset)
    assert again[0].before.tag_rows == 0 and again[0].before.snapshot_seq_nr is None
    assert again[0].before.events == 0  # a tombstone row is not an event
    await _check_deleted_all(env, before, reset=reset)


async def test_bad_pid_is_refused_before_anything_is_deleted(env: Env) -> None:
    await _populate(env)
    before = await env.dump()
    with pytest.raises(InvalidArgument):
        await Cleanup(env.journal.backend).delete_all(["Cart|v1", ""])
    with pytest.raises(InvalidArgument):
        await Cleanup(env.journal.backend).delete_snapshots(["Cart|v1", "x" * 1000])
    with pytest.raises(InvalidArgument):
        await Cleanup(env.journal.backend).run(CleanupAction.DELETE_SNAPSHOTS, ["Cart|v1"], reset_seq_nr=True)
    assert await env.dump() == before


def test_read_pids_skips_blank_lines_and_comments(tmp_path: Path) -> None:
    f = tmp_path / "pids.txt"
    f.write_text("# victims\nCart|v1\n\n  Cart|v2  \n#Cart|b1\n", encoding="utf-8")
    assert read_pids(f) == ["Cart|v1", "Cart|v2"]
    with pytest.raises(InvalidArgument):
        read_pids(tmp_path / "missing.txt")


async def test_cli_dry_run_then_cleanup_with_done_file(env: Env, tmp_path: Path) -> None:
    await _populate(env)
    before = await env.dump()
    pids_file = tmp_path / "pids.txt"
    pids_file.write_text("\n".join(VICTIMS) + "\n", encoding="utf-8")
    done = tmp_path / "done.txt"
    runner = CliRunner()

    def cli(*args: str) -> Any:
        return runner.invoke(app, ["cleanup", *args, "--dsn", env.target], catch_exceptions=False)

    r = await asyncio.to_thread(cli, "delete-all", "--pids-from", str(pids_file), "--dry-run")
    assert r.exit_code == 0, r.output
    assert "Cart|v1: 5 event rows (highest 5), 4 tag rows, snapshot at 3" in r.output
    assert "would delete 10 event rows, 8 tag rows, 1 snapshots" in r.output
    assert await env.dump() == before

    r = await asyncio.to_thread(cli, "delete-all", "Cart|v1", "--pids-from", str(pids_file), "--done-file", str(done))
    assert r.exit_code == 0, r.output
    assert "delete-all: 2 pids" in r.output
    assert read_pids(done) == VICTIMS
    await _check_deleted_all(env, before, reset=False)

    r = await asyncio.to_thread(cli, "delete-all", "--pids-from", str(pids_file), "--done-file", str(done))
    assert r.exit_code == 0, r.output
    assert "0 pids" in r.output and "2 pids already done" in r.output

    r = await asyncio.to_thread(cli, "delete-snapshots")  # one line, the usage exit code
    assert r.exit_code == 2 and "error: no persistence ids" in r.output and "Traceback" not in r.output


async def test_cli_snapshot_commands_report_their_own_action(env: Env) -> None:
    """delete-snapshots and delete-before-snapshot (one command made twice, journal.cli.cleanup):
    each runs its own action and says it."""
    await _populate(env)
    before = await env.dump()
    runner = CliRunner()

    def cli(*args: str) -> Any:
        return runner.invoke(app, ["cleanup", *args, "--dsn", env.target], catch_exceptions=False)

    r = await asyncio.to_thread(cli, "delete-before-snapshot", "Cart|v1", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "delete-before-snapshot: 1 pids, would delete 3 event rows" in r.output
    r = await asyncio.to_thread(cli, "delete-snapshots", *VICTIMS, "--dry-run")
    assert r.exit_code == 0, r.output
    assert "delete-snapshots: 2 pids, would delete 0 event rows, 0 tag rows, 1 snapshots" in r.output
    assert await env.dump() == before
    r = await asyncio.to_thread(cli, "delete-snapshots", *VICTIMS, "--verbose")
    assert r.exit_code == 0, r.output
    assert "delete-snapshots: 2 pids, deleted 0 event rows, 0 tag rows, 1 snapshots" in r.output
    assert "Cart|v1: 5 event rows (highest 5), 4 tag rows, snapshot at 3 -> 5 event rows" in r.output
