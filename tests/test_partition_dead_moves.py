"""A move killed -9 at its fence or at a later step never blocks writes; a write that waits for
a range never holds up the others. Real servers, a real ``journal partitions move`` process.

The mover is stopped at the step under test by a lock the test holds on the database it must
write next (the target's snapshot table at the fence, the target's map at the switch, the
source's tag_scanning table at the removal), killed there with SIGKILL, and the lock released.
Writers keep writing the moved range and the other slices of both databases throughout: the
range is written again within seconds, the other slices never fall below half their rate, and
after the move is run again every acknowledged event is stored once, on the database serving
its slice.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from asyncio.subprocess import DEVNULL, PIPE
from collections.abc import Iterator
from itertools import cycle

import asyncpg
import pytest
from test_partitions import partitioned, stored

from journal import Journal, JournalUnavailable, slice_for
from journal.postgres import asyncpg_dsn, schema_migrations
from tests.support.password_server import PasswordServer, password_server
from tests.support.scratch import scratch_database
from tests.support.waiting import wait_until

LO, HI = 512, 767
BACK_WITHIN = 5.0
"""Seconds after the kill within which the moved range must be written again."""
FENCE_WAIT = 20.0

STEPS = {  # the step: the state that says the mover got there
    "fenced": ("source", "fenced"),
    "switching": ("source", "moved"),
    "removing": ("target", "owned"),
}


def pids_of(et: str, lo: int, hi: int, n: int) -> list[str]:
    return [p for p in (f"{et}|{i:x}{i * 7919:x}" for i in range(5000)) if lo <= slice_for(p) <= hi][:n]


def move_tool(databases: list[str], target: str) -> list[str]:
    return [
        sys.executable, "-m", "journal", "partitions", "move", "--slices", f"{LO}-{HI}", "--to", target,
        "--databases", " ".join(databases), "--dsn", databases[0],
    ]  # fmt: skip


def show_tool(databases: list[str]) -> list[str]:
    return [sys.executable, "-m", "journal", "partitions", "show", "--databases", " ".join(databases)]


class Writers:
    """Writers of one event per call, each on pids of its own, in groups: when each group's calls
    were acknowledged, and each pid's acknowledged sequence numbers."""

    def __init__(self, j: Journal, groups: dict[str, list[str]], per_group: int = 4) -> None:
        self.j = j
        self.groups = groups
        self.per_group = per_group
        self.acks: dict[str, list[float]] = {g: [] for g in groups}
        self.acked: dict[str, set[int]] = {p: set() for ps in groups.values() for p in ps}
        self.failed: list[tuple[str, JournalUnavailable]] = []
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        k = self.per_group
        await asyncio.gather(*(self._writer(g, ps[i::k]) for g, ps in self.groups.items() for i in range(k)))

    async def _writer(self, group: str, mine: list[str]) -> None:
        for n, pid in enumerate(cycle(mine)):
            if self._stop.is_set():
                return
            try:
                (env,) = await self.j.persist(pid, [{"n": n}])
            except JournalUnavailable as e:
                self.failed.append((pid, e))
                continue
            self.acked[pid].add(env.seq_nr)
            self.acks[group].append(time.monotonic())
            await asyncio.sleep(0.001)  # the writer's pace

    def since(self, group: str, t: float) -> int:
        return sum(1 for a in self.acks[group] if a > t)


class Held:
    """A transaction holding the lock ``sql`` takes, until :meth:`release`."""

    def __init__(self, dsn: str, sql: str) -> None:
        self.dsn, self.sql = dsn, sql
        self.conn: asyncpg.Connection | None = None

    async def take(self) -> Held:
        self.conn = await asyncpg.connect(asyncpg_dsn(self.dsn))
        await self.conn.execute("BEGIN")
        await self.conn.execute(self.sql)
        return self

    async def release(self) -> None:
        if self.conn is not None:
            await self.conn.close()  # its transaction ends with it
            self.conn = None


async def state_is(dsn: str, state: str) -> bool:
    return bool(await stored(dsn, "SELECT 1 FROM slice_partition WHERE min_slice = $1 AND state = $2", LO, state))


def rates_in_windows(acks: list[float], start: float, end: float, window: float = 1.0) -> list[float]:
    """Acknowledgements per second in consecutive windows of ``[start, end]``."""
    out = []
    t = start
    while t < end:
        w = min(window, end - t)
        if w < 0.25:
            break
        out.append(sum(1 for a in acks if t < a <= t + w) / w)
        t += w
    return out


@pytest.fixture(scope="module")
def password_servers() -> Iterator[tuple[PasswordServer, PasswordServer]]:
    """Two servers that ask every client for a password (SCRAM over TCP)."""
    with password_server(password="s3cret-a") as a, password_server(password="s3cret-b") as b:
        yield a, b


@pytest.fixture
def password_parts(password_servers: tuple[PasswordServer, PasswordServer]) -> Iterator[list[str]]:
    """A journal database on each server and a move's target beside the second (DSNs with passwords)."""
    a, b = password_servers
    with contextlib.ExitStack() as stack:
        dsns = [stack.enter_context(scratch_database(s.dsn(), "sjdead")) for s in (a, b, b)]
        for d in dsns:  # the target too, as in the other tests (a move migrates it anyway)
            schema_migrations().upgrade(d)
        yield dsns


@pytest.mark.parametrize("step", list(STEPS))
async def test_a_mover_killed_9_never_blocks_the_range_or_the_others(parts: list[str], step: str) -> None:
    await _killed_and_served(parts[:2], parts[2], step)


async def test_a_mover_killed_9_at_the_fence_of_password_servers(password_parts: list[str]) -> None:
    """The same with servers that ask for passwords: the map keeps none, and the writers, the
    lapse of the dead fence and the move run again find them (docs/scaling-out.md, Credentials)."""
    await _killed_and_served(password_parts[:2], password_parts[2], "fenced")
    where = [r[0] for r in await stored(password_parts[1], "SELECT location FROM slice_partition") if r[0]]
    assert where and all("s3cret" not in w for w in where), where  # the map names it, without its password


async def _killed_and_served(dbs: list[str], target: str, step: str) -> None:
    """The mover killed -9 at ``step`` while writers write the range and the others: the range is
    written again within seconds, the others never below half their rate, and after the move is
    run again every acknowledged event is stored once, on the database serving its slice."""
    source = dbs[1]
    et = f"Dead{step.title()}"
    groups = {
        "range": pids_of(et, LO, HI, 40),
        "low": pids_of(et, 0, 511, 40),  # the other database
        "high": pids_of(et, HI + 1, 1023, 40),  # the source's other range
    }
    db, state = STEPS[step]
    dsn_of = {"source": source, "target": target}
    async with partitioned(dbs, eventual_consistency_delay=0.0, fence_wait=FENCE_WAIT) as j:
        for p in groups["range"]:  # rows for the copy, the removal and the snapshots' step
            await j.persist(p, [{"n": -k} for k in range(20)])
        await j.save_snapshot(groups["range"][0], 20, {"state": 1})
        load = Writers(j, groups)
        for p in groups["range"]:
            load.acked[p].update(range(1, 21))
        writing = asyncio.create_task(load.run())
        try:
            t0 = time.monotonic()
            await wait_until(lambda: load.since("low", t0) + load.since("high", t0) >= 600, 60, "a baseline")
            baseline = 600 / (time.monotonic() - t0)
            killed_at, fenced_at = await _kill_mover_at(step, dsn_of, dbs, target, db, state)
            back = await wait_until(
                lambda: next((a for a in load.acks["range"] if a > killed_at), None),
                BACK_WITHIN + FENCE_WAIT,
                "the moved range written again",
            )
            assert back - killed_at < BACK_WITHIN, f"the range was written again only {back - killed_at:.1f}s after"
            on = back + 1.0
            await wait_until(
                lambda: load.since("range", back) >= 100 and load.since("low", on) and load.since("high", on),
                30, "every group writing on for a second after the range was back",
            )  # fmt: skip
            end = time.monotonic()
            others = sorted(load.acks["low"] + load.acks["high"])
            rates = rates_in_windows(others, fenced_at, end)
            assert rates and min(rates) >= baseline / 2, (baseline, rates)
            # the state on disk, in words
            show = await asyncio.create_subprocess_exec(*show_tool(dbs), stdout=PIPE, stderr=PIPE)
            out, err = await asyncio.wait_for(show.communicate(), 60)
            assert show.returncode == 0, err.decode()
            said = out.decode()
            assert {
                "fenced": "interrupted at the fence (no move is running): the fence has lapsed",
                "switching": "interrupted after the switch (no move is running)",
                "removing": "interrupted after the switch (no move is running)",
            }[step] in said, said
            # the move run again finishes
            rerun = await asyncio.create_subprocess_exec(*move_tool(dbs, target), stdout=PIPE, stderr=PIPE)
            out, err = await asyncio.wait_for(rerun.communicate(), 120)
            assert rerun.returncode == 0, err.decode()
            done = time.monotonic()
            await wait_until(lambda: load.since("range", done) >= 50, 30, "the range writing after the move")
        finally:
            load.stop()
            await writing
        assert load.failed == []
        for pid, acked in load.acked.items():  # nothing lost or doubled
            got = [e.seq_nr async for e in j.current_events_by_persistence_id(pid)]
            assert got == sorted(acked), pid
    range_rows = {(r[0], r[1]) for r in await stored(target, "SELECT persistence_id, seq_nr FROM event_journal")}
    assert range_rows == {(p, n) for p in groups["range"] for n in load.acked[p]}  # nothing on the wrong server
    assert await stored(source, "SELECT 1 FROM event_journal WHERE slice BETWEEN $1 AND $2", LO, HI) == []
    assert await stored(source, "SELECT step FROM slice_move") == []


async def _kill_mover_at(
    step: str, dsn_of: dict[str, str], dbs: list[str], target: str, db: str, state: str
) -> tuple[float, float]:
    """Run the move, stop it at ``step`` with locks, kill it -9 there, release the locks; returns
    when it was killed and when the range was first seen fenced."""
    source = dsn_of["source"]
    at_fence = await Held(target, "LOCK TABLE snapshot IN SHARE MODE").take()
    at_switch = Held(target, "LOCK TABLE slice_partition IN EXCLUSIVE MODE")
    at_removal = await Held(source, "LOCK TABLE tag_scanning IN SHARE MODE").take()
    tool = await asyncio.create_subprocess_exec(*move_tool(dbs, target), stdout=DEVNULL, stderr=DEVNULL)
    try:
        await wait_until(lambda: state_is(source, "fenced"), 120, "the fence", every=0.01)
        fenced_at = time.monotonic()
        stopped_on = target
        if step != "fenced":
            if step == "switching":
                await at_switch.take()
            else:
                stopped_on = source
            await at_fence.release()  # the fence's last steps go on
            await wait_until(lambda: state_is(dsn_of[db], state), 60, f"the {db} {state}")
        await wait_until(lambda: _waiting_on_lock(stopped_on), 30, f"the mover stopped at {step}")
        tool.send_signal(signal.SIGKILL)
        await tool.wait()
        return time.monotonic(), fenced_at
    finally:
        if tool.returncode is None:
            tool.kill()
            await tool.wait()
        for held in (at_fence, at_switch, at_removal):
            await held.release()


async def kill_mover_in_its_copy(dbs: list[str], target: str, lock: str) -> None:
    """Run the move, held in its copy by ``lock`` taken on the target, kill it -9 there, release the lock."""
    at_copy = await Held(target, lock).take()
    tool = await asyncio.create_subprocess_exec(*move_tool(dbs, target), stdout=DEVNULL, stderr=DEVNULL)
    try:
        await wait_until(lambda: state_is(dbs[1], "moving"), 120, "the copy", every=0.01)
        await wait_until(lambda: _waiting_on_lock(target), 30, "the mover stopped in its copy")
        tool.send_signal(signal.SIGKILL)
        await tool.wait()
    finally:
        if tool.returncode is None:
            tool.kill()
            await tool.wait()
        await at_copy.release()


async def _waiting_on_lock(dsn: str) -> bool:
    """Some session of this database (the mover's) waits for a lock the test holds."""
    rows = await stored(
        dsn,
        "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
        "AND pid <> pg_backend_pid()",
    )
    return bool(rows)


async def test_a_batch_holding_a_call_of_a_fenced_range_answers_the_others_at_once(parts: list[str]) -> None:
    """A live move fences 512-767 (stopped at its fence by a lock): one write of that range
    and a hundred of other slices, of both databases, sent together: the hundred are answered
    at once, the one when the move is done. A second move of the range meanwhile is refused."""
    dbs, target = parts[:2], parts[2]
    fenced = pids_of("Batch", LO, HI, 1)[0]
    others = pids_of("Batch", 0, 511, 50) + pids_of("Batch", HI + 1, 1023, 50)
    async with partitioned(dbs, eventual_consistency_delay=0.0, fence_wait=FENCE_WAIT) as j:
        await j.persist(fenced, [{"n": 0}])
        at_fence = await Held(target, "LOCK TABLE snapshot IN SHARE MODE").take()
        tool = await asyncio.create_subprocess_exec(*move_tool(dbs, target), stdout=DEVNULL, stderr=PIPE)
        try:
            await wait_until(lambda: state_is(dbs[1], "fenced"), 120, "the fence", every=0.01)
            await wait_until(lambda: _waiting_on_lock(target), 30, "the mover held at its fence")
            first = asyncio.ensure_future(j.persist(others[0], [{"n": 0}]))  # the idle path; the rest queue
            waiting = asyncio.ensure_future(j.persist(fenced, [{"n": 1}]))
            rest = [asyncio.ensure_future(j.persist(p, [{"n": 0}])) for p in others[1:]]
            started = time.monotonic()
            await asyncio.wait_for(asyncio.gather(first, *rest), FENCE_WAIT / 4)
            assert time.monotonic() - started < 3.0
            assert not waiting.done()
            second = await asyncio.create_subprocess_exec(*move_tool(dbs, target), stdout=PIPE, stderr=PIPE)
            _, said = await asyncio.wait_for(second.communicate(), 60)  # a second move of the range: refused
            assert second.returncode == 2 and "another move of slices 512-767 is running" in said.decode(), said
            await at_fence.release()
            _, err = await asyncio.wait_for(tool.communicate(), 120)
            assert tool.returncode == 0, err.decode()
            (env,) = await asyncio.wait_for(waiting, FENCE_WAIT)
            assert env.seq_nr == 2
        finally:
            await at_fence.release()
            if tool.returncode is None:
                tool.kill()
                await tool.wait()
    rows = await stored(target, "SELECT seq_nr FROM event_journal WHERE persistence_id = $1", fenced)
    assert sorted(r[0] for r in rows) == [1, 2]


async def test_a_mover_killed_9_during_the_copy_is_given_up_by_the_next_delete(parts: list[str]) -> None:
    """Killed while it copies (the range ``moving``: writes go on, deletes wait for the move): the
    next delete finds the mover gone, gives the move up and goes on within seconds; the move run
    again copies afresh, so the deleted events do not come back from the first copy."""
    dbs, target = parts[:2], parts[2]
    source = dbs[1]
    pids = pids_of("DeadCopy", LO, HI, 20)
    async with partitioned(dbs, eventual_consistency_delay=0.0, fence_wait=FENCE_WAIT) as j:
        for p in pids:
            await j.persist(p, [{"n": k} for k in range(1, 21)])
        await kill_mover_in_its_copy(dbs, target, "LOCK TABLE event_journal IN SHARE MODE")
        await j.persist(pids[1], [{"n": 21}])  # writes go on meanwhile
        started = time.monotonic()
        await j.delete_events_to(pids[0], 10)
        assert time.monotonic() - started < BACK_WITHIN
        assert await state_is(source, "owned") and await stored(source, "SELECT 1 FROM slice_move") == []
        rerun = await asyncio.create_subprocess_exec(*move_tool(dbs, target), stdout=PIPE, stderr=PIPE)
        _, err = await asyncio.wait_for(rerun.communicate(), 120)
        assert rerun.returncode == 0, err.decode()
        assert [e.seq_nr async for e in j.current_events_by_persistence_id(pids[0])] == list(range(11, 21))
        assert [e.seq_nr async for e in j.current_events_by_persistence_id(pids[1])] == list(range(1, 22))
    on_target = await stored(target, "SELECT seq_nr FROM event_journal WHERE persistence_id = $1", pids[0])
    assert sorted(r[0] for r in on_target) == list(range(11, 21))
