"""A projection that starts from snapshots (issue 36, item 2), on worker processes.

Two workers start from snapshots while events and snapshots keep being written; one is killed
with SIGKILL mid catch-up and a new one takes over. Its read model must equal the one a plain
projection builds from every event (the pids whose events were deleted up to a snapshot, or that
only have a snapshot, are the snapshot's), with the issue's bad input in the journal: a snapshot
beyond its pid's last event, a deleted snapshot, a pid with only a snapshot. The handlers
(tests/snapshot_model.py) fail on any skipped or repeated event.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import asyncpg
import pytest
from projection_helpers import FAST_ENV, spawn_worker, stop
from snapshot_model import create, table

from journal import Journal, slice_for
from tests.support.waiting import wait_until

ET = "SnapAcct"
SNAP = ["--from-snapshots", "--snapshot-handler", "tests.snapshot_model:restore"]


@pytest.fixture
async def conn(journal: Journal, dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    await create(c, ET)
    yield c
    await c.close()


async def write(j: Journal, pid: str, first: int, count: int, every: int = 10) -> None:
    """Events ``first..first+count-1`` of ``pid`` (``n`` = seq_nr), five a call, with the sum
    saved as a snapshot at every multiple of ``every``."""
    seq = first
    while seq < first + count:
        n = min(5, first + count - seq)
        await j.persist(pid, [{"n": s} for s in range(seq, seq + n)], expected_seq_nr=seq - 1)
        for s in range(seq, seq + n):
            if every and s % every == 0:
                await j.save_snapshot(pid, s, {"sum": s * (s + 1) // 2})
        seq += n


async def model(conn: asyncpg.Connection, kind: str) -> dict[str, tuple[int, int]]:
    rows = await conn.fetch(f"SELECT pid, total, last_seq FROM {table(kind, ET)}")
    return {r["pid"]: (r["total"], r["last_seq"]) for r in rows}


async def complete(conn: asyncpg.Connection, kind: str, want: dict[str, int]) -> bool:
    got = await model(conn, kind)
    return all(got.get(pid, (0, 0))[1] == seq for pid, seq in want.items())


async def test_kill9_mid_catch_up_from_snapshots_gives_the_full_reads_model(
    journal: Journal, conn: asyncpg.Connection, dsn: str
) -> None:
    j = journal
    snapped = [f"{ET}|s{i}" for i in range(60)]
    plain = [f"{ET}|p{i}" for i in range(30)]
    await asyncio.gather(*(write(j, p, 1, 33) for p in snapped), *(write(j, p, 1, 12, every=0) for p in plain))
    await write(j, f"{ET}|ahead", 1, 6, every=0)
    await j.save_snapshot(f"{ET}|ahead", 40, {"sum": -1})  # beyond its last event: not used
    await write(j, f"{ET}|deleted", 1, 12)
    await j.delete_snapshot(f"{ET}|deleted")
    await j.save_snapshot(f"{ET}|only", 30, {"sum": 465})  # no events at all
    await write(j, f"{ET}|trimmed", 1, 20)
    await j.delete_events_to(f"{ET}|trimmed", 20)  # events deleted up to the snapshot
    slow = {"SNAPSHOT_MODEL_PAUSE": "0.02", "JOURNAL_PROJECTION_GROUP_SIZE": "10"}
    procs = [spawn_worker(dsn, "full", ET, "tests.snapshot_model:full")]
    procs += [spawn_worker(dsn, "fs", ET, "tests.snapshot_model:from_snapshots", extra=SNAP, env=slow) for _ in "ab"]

    killed = asyncio.Event()

    async def load() -> None:  # events and snapshots go on being written during the catch-up, past the kill
        rng = random.Random(36)
        for i in itertools.count():  # 7 events at a time: most writes pass a multiple of 10, a snapshot
            if i >= 700 and killed.is_set():
                return
            pid = rng.choice(snapped + plain + [f"{ET}|trimmed"])
            await write(j, pid, await j.highest_seq_nr(pid) + 1, 7, every=0 if "|p" in pid else 10)

    writer = asyncio.create_task(load())
    try:
        await wait_until(lambda: _rows(conn, 25), 60, "the projection from snapshots under way")
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        at_kill = len(await model(conn, "snap"))
        assert at_kill < len(snapped) + len(plain), f"the kill came after the catch-up ({at_kill})"
        killed.set()  # (a fixed number of writes could end before a worker slow to start under load got going)
        procs.append(spawn_worker(dsn, "fs", ET, "tests.snapshot_model:from_snapshots", extra=SNAP, env=slow))
        await wait_until(lambda: _rows(conn, len(snapped) + len(plain) + 4), 90, "the restarted catch-up")
        await writer
        want = {pid: await j.highest_seq_nr(pid) async for pid in j.current_persistence_ids(ET)}
        await wait_until(lambda: complete(conn, "full", want), 90, "the full read's model")
        await wait_until(lambda: complete(conn, "snap", want | {f"{ET}|only": 30}), 90, "the model from snapshots")
    finally:
        writer.cancel()
        stop(procs)
    full, snap = await model(conn, "full"), await model(conn, "snap")
    assert snap.pop(f"{ET}|only") == (465, 30)
    last = want[f"{ET}|trimmed"]
    assert snap.pop(f"{ET}|trimmed") == (last * (last + 1) // 2, last)
    assert full.pop(f"{ET}|trimmed")[0] == sum(range(21, last + 1))
    assert snap == full and len(full) == len(snapped) + len(plain) + 2
    assert snap[f"{ET}|ahead"] == (21, 6) and snap[f"{ET}|deleted"] == (78, 12)


async def test_a_snapshot_replaced_past_the_bound_or_deleted_after_a_kill_leaves_no_gap(
    journal: Journal, conn: asyncpg.Connection, dsn: str
) -> None:
    """The case the per-pid replay could not close: a catch-up from snapshots passes ``g*``'s
    events 1-9 (their snapshot at 10 covers them) and is killed with SIGKILL before it reaches
    event 10; the restarted catch-up takes its bound, and then half of the snapshots are
    replaced by ones at 15 (past that bound), the other half deleted, before the query reaches
    event 10. Events 10.. then come as events, and events 1-9 lie further behind the slice's
    offset than ``offset_delete_after`` (1.5 s here; ``offset_time_window`` 1 s). The model must
    still be the full read's (a handler that gets a skipped event fails, and the worker stops)."""
    j = journal
    gapped = [f"{ET}|g{i}" for i in range(6)]
    replaced, deleted = gapped[:3], gapped[3:]
    filler = [_same_slice(g) for g in gapped] + [f"{ET}|f{i}" for i in range(34)]
    await asyncio.gather(*(write(j, p, 1, 9, every=0) for p in gapped))
    t0 = await conn.fetchval("SELECT clock_timestamp()")
    await wait_until(lambda: _clock_past(conn, t0, 2.0), 10, "2 s of db_timestamps past g*'s events")
    await asyncio.gather(*(write(j, p, 1, 30, every=0) for p in filler))  # 1,200 events, 2 s after g*'s first 9
    await asyncio.gather(*(write(j, p, 10, 3, every=10) for p in gapped))  # a snapshot at 10, events 10-12
    await asyncio.gather(*(write(j, p, 31, 5, every=0) for p in filler))
    env = {
        "SNAPSHOT_MODEL_PAUSE": "0.02", "JOURNAL_PROJECTION_GROUP_SIZE": "10", "JOURNAL_PROJECTION_QUEUE_SIZE": "20",
        "JOURNAL_PROJECTION_OFFSET_TIME_WINDOW": "1", "JOURNAL_PROJECTION_OFFSET_DELETE_AFTER": "1.5",
        "JOURNAL_QUERY_BUFFER_SIZE": "20", "JOURNAL_QUERY_CATCH_UP_BUFFER_SIZE": "20",
    }  # fmt: skip
    procs = [spawn_worker(dsn, "full", ET, "tests.snapshot_model:full", env=env)]
    procs.append(spawn_worker(dsn, "fs", ET, "tests.snapshot_model:from_snapshots", extra=SNAP, env=env))
    try:
        await wait_until(lambda: _filler_done(conn, filler, 250), 60, "the catch-up under way")
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        assert await _filler_done(conn, filler, 0) < 900, "the kill came after g*'s event 10"
        procs.append(spawn_worker(dsn, "fs", ET, "tests.snapshot_model:from_snapshots", extra=SNAP, env=env))
        await wait_until(lambda: _owns_all(conn, procs[2].pid), 60, "the new worker holding every slice")
        owned_at = await _filler_done(conn, filler, 0)
        await wait_until(lambda: _filler_done(conn, filler, owned_at + 60), 60, "the restarted catch-up")
        # its bound is taken: snapshots at 15 lie past it; the query is well before g*'s event 10
        await asyncio.gather(*(write(j, p, 13, 3, every=15) for p in replaced))
        await asyncio.gather(*(write(j, p, 13, 3, every=0) for p in deleted), *map(j.delete_snapshot, deleted))
        assert await _filler_done(conn, filler, 0) < 1000, "the restarted catch-up reached g*'s event 10"
        want = {p: 15 for p in gapped} | {p: 35 for p in filler}
        await wait_until(lambda: _complete_or_failed(conn, "full", want, procs), 90, "the full read's model")
        await wait_until(lambda: _complete_or_failed(conn, "snap", want, procs), 90, "the model from snapshots")
        errors = await conn.fetch("SELECT error FROM projection_worker WHERE error IS NOT NULL")
        assert all(p.poll() is None for p in procs[::2]), f"a worker stopped: {[r['error'] for r in errors]}"
    finally:
        stop(procs)
    full, snap = await model(conn, "full"), await model(conn, "snap")
    assert snap == full and full[gapped[0]] == full[gapped[-1]] == (120, 15)


async def _clock_past(conn: asyncpg.Connection, t0: object, seconds: float) -> bool:
    past = await conn.fetchval("SELECT clock_timestamp() > $1::timestamptz + make_interval(secs => $2)", t0, seconds)
    return bool(past)


def _same_slice(pid: str) -> str:
    """A filler pid in ``pid``'s slice: that slice's offset then moves on past ``pid``'s events."""
    return next(f"{pid}-f{k}" for k in range(100_000) if slice_for(f"{pid}-f{k}") == slice_for(pid))


async def _owns_all(conn: asyncpg.Connection, pid: int) -> bool:
    """Does the worker process ``pid`` hold every slice of the projection from snapshots (its
    range's processor, and so its query, started after that)?"""
    held = await conn.fetchval(
        "SELECT count(*) FROM projection_slice_lease WHERE projection_name = 'fs' AND owner LIKE $1 "
        "AND expires_at > now()",
        f"%-{pid}-%",
    )
    return bool(held == 1024)


async def _filler_done(conn: asyncpg.Connection, filler: list[str], n: int) -> int:
    """The filler events the projection from snapshots has applied (truthy when at least ``n``)."""
    got = await model(conn, "snap")
    done = sum(got.get(p, (0, 0))[1] for p in filler)
    return done if done >= n else 0


async def _complete_or_failed(
    conn: asyncpg.Connection, kind: str, want: dict[str, int], procs: list[subprocess.Popen[bytes]]
) -> bool:
    return any(p.poll() is not None for p in procs[::2]) or await complete(conn, kind, want)


async def _rows(conn: asyncpg.Connection, n: int) -> bool:
    return len(await model(conn, "snap")) >= n


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--snapshot-handler", "tests.snapshot_model:restore"], "--snapshot-handler needs --from-snapshots"),
        (["--from-snapshots", "--tag", "t"], "--from-snapshots runs a handler over an entity type's events"),
        (["--from-snapshots", "--states"], "--from-snapshots runs a handler over an entity type's events"),
        (["--from-snapshots", "--snapshot-handler", "tests.snapshot_model:nope"], "nope"),
    ],
)
def test_bad_options_one_line_exit_2(dsn: str, args: list[str], message: str) -> None:
    entity = [] if "--tag" in args else ["--entity-type", ET]
    out = subprocess.run(
        [sys.executable, "-m", "projections", "run", "x", *entity, "--handler", "tests.snapshot_model:full",
         "--dsn", dsn, "--no-progress", *args],
        capture_output=True, text=True, env={**os.environ, **FAST_ENV}, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
