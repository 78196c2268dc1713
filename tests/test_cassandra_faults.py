"""Cassandra faults, on a node of this test's own (the session's node is not disturbed): the node
is killed while entities write and while a live tag query runs, then restarted on the same data.

Writes fail with ``JournalUnavailable`` saying whether their outcome is known; nothing that was
acknowledged is lost; a write that failed with ``outcome_unknown=False`` left nothing behind; the
live query resumes by itself and delivers every stored tagged event exactly once, in order per pid.
Configuration that names an invalid keyspace is refused before any I/O; a missing keyspace, an
unreachable node and a refused login are typed errors.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cassandra_fixtures import CassandraTarget, create_keyspace, recent_first_bucket, skip_or_fail
from tag_backends import CassandraRaw

from journal import ConfigurationError, JournalSettings, JournalUnavailable, open_journal
from journal.cassandra.local import LocalCassandra, free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.cassandra

ROOT = Path(__file__).resolve().parents[1]

SETTINGS: dict[str, Any] = dict(
    eventual_consistency_delay=5.0, query_refresh_interval=0.1, back_track_interval=0.2, back_track_period=2.0,
    tag_write_timeout=2.0, retry_initial_backoff=0.05, retry_max_backoff=0.5, gap_timeout=5.0,
)  # fmt: skip
# eventual_consistency_delay: the reference's default. With 0, a pid's first tag row landing after the live
# query passed its TimeUUID (a loaded machine) is skipped, as in the reference (seen: ('F|2', 1) not delivered).


@pytest.fixture
def own_node(tmp_path: Path) -> Iterator[LocalCassandra]:
    pytest.importorskip("cassandra")
    from journal.errors import CassandraSetupError

    node = LocalCassandra(tmp_path / "node", durable=True)  # acknowledged = on disk (the node is SIGKILLed)
    try:
        node.start()
    except CassandraSetupError as e:
        skip_or_fail(str(e))
    try:
        yield node
    finally:
        node.stop()


async def test_node_killed_during_writes_and_a_live_tag_query(own_node: LocalCassandra) -> None:
    with own_node.session() as s:
        ks = create_keyspace(s)
    dsn = f"cassandra://{own_node.contact_point}/{ks}"
    settings = JournalSettings.load(env={}, first_time_bucket=recent_first_bucket(), **SETTINGS)
    pids = [f"F|{i}" for i in range(4)]
    acked: dict[str, list[tuple[int, str]]] = {p: [] for p in pids}
    failed: list[tuple[str, str, JournalUnavailable]] = []
    other_errors: list[BaseException] = []
    seen: list[tuple[str, int]] = []
    phase = {"after_restart": False, "stop": False}
    acked_after_restart = {p: 0 for p in pids}

    async with open_journal(dsn, settings=settings) as j:

        async def writer(pid: str) -> None:
            attempt = 0
            while not phase["stop"]:
                attempt += 1
                value = f"{pid}#{attempt}"
                try:
                    envs = await j.persist(pid, [value], tags=["f"])
                except JournalUnavailable as e:
                    failed.append((pid, value, e))
                    await asyncio.sleep(0.05)
                    continue
                except Exception as e:  # anything else is a bug: recorded, asserted below
                    other_errors.append(e)
                    await asyncio.sleep(0.05)
                    continue
                acked[pid].append((envs[0].seq_nr, value))
                if phase["after_restart"]:
                    acked_after_restart[pid] += 1
                await asyncio.sleep(0.01)  # the load's pace (and its back-off above): the scenario

        async def consume() -> None:
            async for e in j.events_by_tag("f"):
                seen.append((e.persistence_id, e.seq_nr))

        consumer = asyncio.create_task(consume())
        writers = [asyncio.create_task(writer(p)) for p in pids]
        try:
            await wait_until(lambda: all(len(a) >= 5 for a in acked.values()), 120, "first writes")
            await wait_until(lambda: len(seen) >= 10, 120, "the live query's first events")
            own_node.stop(kill=True)  # a crash: SIGKILL
            failures_before = len(failed)
            await wait_until(lambda: len(failed) >= failures_before + 2 * len(pids), 120, "writes failing")
            restarted = LocalCassandra(
                own_node.data_dir, port=own_node.port, storage_port=own_node.storage_port, durable=True
            )
            restarted.start()
            own_node.process = restarted.process  # the fixture stops it
            phase["after_restart"] = True
            await wait_until(lambda: all(n >= 3 for n in acked_after_restart.values()), 120, "writes after the restart")
            phase["stop"] = True
            await asyncio.gather(*writers)
            stored = {p: [(e.seq_nr, e.event) async for e in j.current_events_by_persistence_id(p)] for p in pids}
            listed = [p async for p in j.current_persistence_ids("F")]
            total = sum(len(v) for v in stored.values())
            try:
                await wait_until(
                    lambda: len(seen) >= total or consumer.done(), 120, f"the live query to deliver all {total} events"
                )
            except AssertionError as e:
                missing = sorted({(p, n) for p in pids for n, _ in stored[p]} - set(seen))
                progress = [(p, await j.highest_seq_nr(p)) for p in pids]
                detail = f"not delivered: {missing}; failed writes: {len(failed)}; highest: {progress}"
                raise AssertionError(f"{e}; {detail}") from None
            if consumer.done():
                consumer.result()  # the live query must not end: raise what ended it
        finally:
            phase["stop"] = True
            consumer.cancel()
            await asyncio.gather(consumer, *writers, return_exceptions=True)

    assert not other_errors, other_errors
    assert failed, "the node's death must fail some writes"
    assert all(isinstance(e.outcome_unknown, bool) for _, _, e in failed)
    assert listed == pids
    for pid in pids:
        values = [v for _, v in stored[pid]]
        assert [s for s, _ in stored[pid]] == list(range(1, len(stored[pid]) + 1)), pid  # no holes
        for seq, value in acked[pid]:  # nothing acknowledged is lost
            assert (seq, value) in stored[pid], (pid, seq, value)
        for fpid, value, e in failed:
            if fpid == pid and not e.outcome_unknown:
                assert value not in values, f"{value} failed with outcome_unknown=False but is stored"
    # the live query resumed by itself: every stored event once, each pid in order
    assert len(seen) == len(set(seen)) == total
    for pid in pids:
        assert [s for p, s in seen if p == pid] == [s for s, _ in stored[pid]]


async def test_invalid_keyspace_refused_before_any_io() -> None:
    # port 1: nothing listens there, so any attempt to connect would fail differently
    for bad in ("bad-name", "x" * 49, "1abc", "ks;DROP"):
        with pytest.raises(ConfigurationError, match="not a valid Cassandra identifier"):
            async with open_journal(f"cassandra://127.0.0.1:1/{bad}", settings=JournalSettings.load(env={})):
                pass


async def test_missing_keyspace_unreachable_node_and_refused_login_are_typed(
    cassandra_node: CassandraTarget, cassandra_auth_node: CassandraTarget
) -> None:
    settings = JournalSettings.load(env={})
    with pytest.raises(ConfigurationError, match=r"keyspace 'sj_missing' or its tables are missing.*cassandra-schema"):
        async with open_journal(cassandra_node.dsn("sj_missing"), settings=settings):
            pass
    with pytest.raises(JournalUnavailable, match=r"cannot connect to Cassandra at cassandra://127\.0\.0\.1:\d+") as ei:
        async with open_journal(f"cassandra://127.0.0.1:{free_port()}/ks", settings=settings):
            pass
    assert not ei.value.outcome_unknown
    with pytest.raises(ConfigurationError, match=r"cannot connect to Cassandra at .*: authentication failed"):
        async with open_journal(cassandra_auth_node.dsn("ks"), settings=settings):
            pass


async def test_journal_process_killed_between_events_and_tag_rows(cassandra_dsn: str, cassandra_session: Any) -> None:
    """The real crash window of the Cassandra write path: a writer process SIGKILLed after some
    events are stored and before their tag rows are. The next journal's first write of each pid
    recovers them: the tag view then holds every stored event once, in order per pid."""
    first = recent_first_bucket()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.tag_writer_worker", cassandra_dsn, first, "6",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    stdout, stderr = proc.stdout, proc.stderr
    acked: list[tuple[str, int]] = []
    ks = cassandra_dsn.rsplit("/", 1)[1]

    async def read_acks() -> None:
        while line := await stdout.readline():
            _, pid, seq = line.decode().split()
            acked.append((pid, int(seq)))

    def stored_count() -> int:
        return len(list(cassandra_session.execute(f"SELECT sequence_nr FROM {ks}.messages")))

    reader = asyncio.create_task(read_acks())
    try:
        await wait_until(lambda: len(acked) >= 30 or reader.done(), 120, "30 acknowledged writes")
        assert not reader.done(), (await stderr.read()).decode()[-2000:]

        async def unacknowledged_stored() -> bool:  # their tag rows wait: the window to kill in
            return await asyncio.to_thread(stored_count) >= len(acked) + 3

        await wait_until(unacknowledged_stored, 60, "stored events not yet acknowledged", every=0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        await reader
    raw = CassandraRaw(cassandra_session, ks)
    # a current query after every write was acknowledged: nothing is in flight, no delay needed
    settings = JournalSettings.load(env={}, first_time_bucket=first, **{**SETTINGS, "eventual_consistency_delay": 0.0})
    async with open_journal(cassandra_dsn, settings=settings) as j:
        pids = [p async for p in j.current_persistence_ids("K")]
        stored = {p: [e.seq_nr async for e in j.current_events_by_persistence_id(p)] for p in pids}
        assert all((p, s) in {(q, t) for q in stored for t in stored[q]} for p, s in acked)  # nothing acked lost
        untagged = sum(len(v) for v in stored.values()) - len(await raw.tag_rows())
        assert untagged > 0, "the kill must leave stored events without their tag rows"
        for p in pids:  # each pid's next write recovers its missing tag rows first
            await j.persist(p, [{"after": True}], tags=["k"])
            stored[p].append(stored[p][-1] + 1 if stored[p] else 1)
        got = [(e.persistence_id, e.seq_nr) async for e in j.current_events_by_tag("k")]
    assert len(got) == len(set(got)) == sum(len(v) for v in stored.values())
    for p in pids:
        assert [s for q, s in got if q == p] == stored[p]
