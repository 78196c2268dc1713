"""The first events of a new pid, committed late while another writer races on that pid.

The adversary of issue 12 (item 1): a writer takes its timestamp for the first events of a new
pid, then stalls (well inside ``backtracking_behind_current_time``) before committing; a racing
writer on the same pid blocks on the unique key, gets a conflict when the first commits, and
writes the next events at once. The live query sees those next events long before backtracking
reaches the first ones. Every committed event must still be delivered exactly once and in order
per pid, in both modes, also by queries restarted from offsets taken along the way.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict

import asyncpg
import pytest
from slice_helpers import Consumer, LateWriter, request

from journal import EventEnvelope, Journal, JournalSettings, SequenceConflict, TimestampOffset, open_journal
from journal.postgres.backend import PostgresBackend
from journal.postgres.dsn import asyncpg_dsn
from journal.settings import QueryMode
from projections import Worker
from tests.support.waiting import wait_until

ET = "first"
WRITE_SECONDS = 6.0
BEHIND = 4.0  # backtracking_behind_current_time: every stall below stays inside it
RANGES = ((0, 255), (256, 511), (512, 767), (768, 1023))
Key = tuple[str, int]


def _after(e: EventEnvelope, o: TimestampOffset) -> bool:
    return e.db_timestamp > o.timestamp or (
        e.db_timestamp == o.timestamp and e.seq_nr > o.seen.get(e.persistence_id, 0)
    )


def _check_order(events: list[EventEnvelope], what: str) -> None:
    """No event twice; each pid's events consecutive and ascending."""
    keys = [(e.persistence_id, e.seq_nr) for e in events]
    assert len(keys) == len(set(keys)), f"{what}: duplicates"
    last: dict[str, int] = {}
    for pid, seq in keys:
        if pid in last:
            assert seq == last[pid] + 1, f"{what}: {pid} #{seq} delivered after #{last[pid]}"
        last[pid] = seq


class Adversary:
    """Stalled first writes of new pids, racers on the same pids, and plain writers."""

    def __init__(self, j: Journal, dsn: str, seed: int) -> None:
        self.j = j
        self.dsn = dsn
        self.rnd = random.Random(seed)
        backend = j.backend
        assert isinstance(backend, PostgresBackend)
        self.backend = backend
        self.committed: set[Key] = set()
        self.raced: dict[str, int] = {}  # pid -> the seq_nr its racer wrote first
        self.stop = 0.0
        self.runs = 0

    async def run(self, seconds: float) -> None:
        self.stop = time.monotonic() + seconds
        self.runs += 1
        await asyncio.gather(*(self._stalled(w) for w in range(4)), *(self._plain(w) for w in range(2)))

    async def _stalled(self, w: int) -> None:
        n = 0
        racers: list[asyncio.Task[None]] = []
        while time.monotonic() < self.stop:
            pid = f"{ET}|s{self.runs}-{w}-{n}"
            first = self.rnd.randint(1, 3)
            lw = LateWriter(self.j, self.dsn)
            rows = await lw.begin_and_write([request(self.j, pid, [f"first-{k}" for k in range(first)])])
            assert rows[0]["first_seq_nr"] == 1
            racers.append(asyncio.create_task(self._race(pid, first)))
            await asyncio.sleep(self.rnd.uniform(0.3, BEHIND - 1.5))  # the insert stalls
            await lw.commit()
            self.committed.update((pid, k) for k in range(1, first + 1))
            n += 1
        await asyncio.gather(*racers)

    async def _race(self, pid: str, first: int) -> None:
        """Write to the pid at once: blocks on the unique key, conflicts, then succeeds."""
        conn = await asyncpg.connect(asyncpg_dsn(self.dsn))
        try:
            for _ in range(self.rnd.randint(1, 2)):
                while True:
                    try:
                        got = await self.backend.write_on(conn, request(self.j, pid, ["racer", "racer"]))
                        break
                    except SequenceConflict:
                        await asyncio.sleep(0)
                first = got.first_seq_nrs[0]
                self.raced.setdefault(pid, first)
                self.committed.update({(pid, first), (pid, first + 1)})
        finally:
            await conn.close()

    async def _plain(self, w: int) -> None:
        while time.monotonic() < self.stop:
            pid = f"{ET}|p{w}-{self.rnd.randrange(40)}"
            envs = await self.j.persist(pid, [{"w": w}] * self.rnd.randint(1, 3))
            self.committed.update((e.persistence_id, e.seq_nr) for e in envs)
            await asyncio.sleep(self.rnd.random() * 0.02)  # the writers' jitter (the scenario)


async def _deliver_all(j: Journal, offset: TimestampOffset | None, wanted: set[Key], what: str) -> list[EventEnvelope]:
    consumers = [Consumer(j.events_by_slices(ET, lo, hi, offset)) for lo, hi in RANGES]

    def got() -> set[Key]:
        return {(e.persistence_id, e.seq_nr) for c in consumers for e in c.events}

    try:
        try:
            await wait_until(lambda: got() >= wanted, 45, what)
        except AssertionError:
            missing = sorted(wanted - got())
            raise AssertionError(f"{what}: {len(missing)} of {len(wanted)} never delivered: {missing[:12]}") from None
        await asyncio.sleep(1.0)  # a duplicate would show by now
    finally:
        for c in consumers:
            await c.stop()
    every: list[EventEnvelope] = []
    for c in consumers:
        _check_order(c.events, what)
        every.extend(c.events)
    return every


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["backtracking", "horizon"])
async def test_first_events_of_a_raced_pid_committed_late_are_delivered_once_in_order(
    journal: Journal, dsn: str, mode: QueryMode
) -> None:
    settings = JournalSettings.load(
        env={}, dsn=dsn, buffer_size=50, catch_up_buffer_size=120, refresh_interval=0.3,
        backtracking_window=30.0, backtracking_behind_current_time=BEHIND, mode=mode,
    )  # fmt: skip
    seed = random.randrange(1 << 30)
    async with open_journal(dsn, settings=settings) as j:
        adv = Adversary(j, dsn, seed)
        consumers = [Consumer(j.events_by_slices(ET, lo, hi)) for lo, hi in RANGES]
        try:
            await adv.run(WRITE_SECONDS)
            # the racers really overtook: their events were committed right after a late first
            assert len(adv.raced) >= 8 and all(seq > 1 for seq in adv.raced.values()), (seed, adv.raced)

            def got() -> set[Key]:
                return {(e.persistence_id, e.seq_nr) for c in consumers for e in c.events}

            try:
                await wait_until(lambda: got() >= adv.committed, 45, f"every committed event ({mode})")
            except AssertionError:
                missing = sorted(adv.committed - got())
                raise AssertionError(
                    f"{mode}, seed {seed}: {len(missing)} of {len(adv.committed)} never delivered: {missing[:12]}"
                ) from None
            await asyncio.sleep(1.0)  # a duplicate would show by now
        finally:
            for c in consumers:
                await c.stop()
        per_pid: dict[str, list[int]] = defaultdict(list)
        for c in consumers:
            _check_order(c.events, f"{mode}, seed {seed}")
            for e in c.events:
                per_pid[e.persistence_id].append(e.seq_nr)
        assert {(p, s) for p, seqs in per_pid.items() for s in seqs} == adv.committed
        assert all(seqs[0] == 1 for seqs in per_pid.values())
        assert all(e.has_payload and e.event is not None for c in consumers for e in c.events)

        # Restarts from offsets taken along the way: everything after the offset, exactly once, in order.
        stream = consumers[0].events + consumers[1].events
        picks = [stream[len(stream) * k // 4].offset for k in (1, 2, 3)]
        for o in picks:
            assert isinstance(o, TimestampOffset)
            wanted = {(e.persistence_id, e.seq_nr) for c in consumers for e in c.events if _after(e, o)}
            await _deliver_all(j, o, wanted, f"{mode}, seed {seed}, restart from {o.timestamp.isoformat()}")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["backtracking", "horizon"])
async def test_a_projection_applies_every_raced_first_event_once_in_order_across_a_restart(
    journal: Journal, dsn: str, mode: QueryMode
) -> None:
    settings = JournalSettings.load(
        env={}, dsn=dsn, buffer_size=50, refresh_interval=0.3, backtracking_window=30.0,
        backtracking_behind_current_time=BEHIND, mode=mode, lease_ttl=4.0, lease_renew_interval=0.5,
        heartbeat_offset_interval=1.0,
    )  # fmt: skip
    seed = random.randrange(1 << 30)
    table = await asyncpg.connect(asyncpg_dsn(dsn))
    await table.execute("CREATE TABLE IF NOT EXISTS t_first (n BIGSERIAL, pid TEXT, seq BIGINT)")
    await table.execute("TRUNCATE t_first")

    async def apply(conn: asyncpg.Connection, envs: list[EventEnvelope]) -> None:
        rows = [(e.persistence_id, e.seq_nr) for e in envs]
        await conn.executemany("INSERT INTO t_first (pid, seq) VALUES ($1, $2)", rows)

    try:
        async with open_journal(dsn, settings=settings) as j:
            adv = Adversary(j, dsn, seed)
            for part in range(2):  # a worker per half of the writes: the second resumes from stored offsets
                async with open_journal(dsn, settings=settings) as wj:
                    w = Worker(wj, settings, f"p-first-{mode}", ET, apply, "grouped")
                    task = asyncio.create_task(w.run())
                    try:
                        await adv.run(WRITE_SECONDS / 2)
                        if part == 1:

                            async def applied() -> bool:
                                n = await table.fetchval("SELECT count(DISTINCT (pid, seq)) FROM t_first")
                                return int(n) >= len(adv.committed)

                            await wait_until(applied, 45, f"every committed event applied ({mode}, seed {seed})")
                            await asyncio.sleep(1.0)  # a duplicate would show by now
                    finally:
                        w.stop()
                        await task
        rows = await table.fetch("SELECT pid, seq FROM t_first ORDER BY n")
    finally:
        await table.close()
    keys = [(r["pid"], r["seq"]) for r in rows]
    assert len(keys) == len(set(keys)), f"applied twice ({mode}, seed {seed})"
    assert set(keys) == adv.committed
    last: dict[str, int] = {}
    for pid, seq in keys:
        assert seq == last.get(pid, 0) + 1, f"{pid} #{seq} applied after #{last.get(pid)} ({mode}, seed {seed})"
        last[pid] = seq


def test_backtracking_state_tells_what_an_event_must_not_overtake() -> None:
    from datetime import UTC, datetime, timedelta

    from journal.query.backtracking import UNKNOWN, BacktrackingState

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    q = JournalSettings.load(env={}, backtracking_window=30.0).query
    bt = BacktrackingState(TimestampOffset(t0, {"a|1": 4}), q)
    assert bt.first_undelivered("a|1", 4) is None  # in the start offset's seen
    assert bt.first_undelivered("a|1", 5) == 5
    assert bt.first_undelivered("a|1", 7) == 5  # 5 and 6 first
    assert bt.first_undelivered("b|1", 1) == 1
    assert bt.first_undelivered("b|1", 4) == UNKNOWN  # not in memory: its previous event decides
    assert bt.covered(t0 - timedelta(microseconds=1)) and not bt.covered(t0)
    bt.mark("b|1", 3, t0 + timedelta(seconds=1))
    assert bt.first_undelivered("b|1", 3) is None and bt.first_undelivered("b|1", 4) == 4
    bt._prune(t0 + timedelta(seconds=2))  # a round's lower bound passes b|1's last event
    assert bt.first_undelivered("b|1", 4) == UNKNOWN
    assert bt.covered(t0 + timedelta(seconds=1))
