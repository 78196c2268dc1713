"""What the reference's Cassandra journal offers, on a real node: partitions, consistency levels,
authentication, batch sizes, the single-writer check, the eventual-consistency delay and the
new-persistence-id scan. Never mocked (the node comes from tests/cassandra_fixtures.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from cassandra_fixtures import CassandraTarget, create_keyspace, recent_first_bucket

from journal import Journal, JournalSettings, JournalUnavailable, SequenceConflict, open_journal
from journal.cassandra.writes import Call
from journal.errors import ConfigurationError, InvalidArgument, StorageError
from journal.offsets import TimeUUIDOffset
from journal.write_batch import WriteBatch

pytestmark = pytest.mark.cassandra

FAST: dict[str, Any] = dict(eventual_consistency_delay=0.0, query_refresh_interval=0.05)


@pytest.fixture(scope="module")
def keyspace(cassandra_session: Any) -> Iterator[str]:
    """One keyspace for this module; every test uses its own persistence ids."""
    ks = create_keyspace(cassandra_session)
    yield ks
    cassandra_session.execute(f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)


@pytest.fixture
def target(cassandra_node: CassandraTarget, keyspace: str) -> str:
    return cassandra_node.dsn(keyspace)


def pid(prefix: str = "F") -> str:
    return f"{prefix}|{uuid.uuid4().hex[:12]}"


@asynccontextmanager
async def journal(target: str, **overrides: Any) -> AsyncIterator[Journal]:
    settings = JournalSettings.load(env={}, first_time_bucket=recent_first_bucket(), **{**FAST, **overrides})
    async with open_journal(target, settings=settings) as j:
        yield j


async def seqs(j: Journal, p: str, from_seq_nr: int = 1) -> list[int]:
    return [e.seq_nr async for e in j.current_events_by_persistence_id(p, from_seq_nr)]


def partitions_of(session: Any, keyspace: str, p: str, upto: int) -> dict[int, int]:
    """seq_nr -> partition_nr as stored (read straight from the table)."""
    out: dict[int, int] = {}
    for part in range(upto + 2):
        for r in session.execute(
            f"SELECT sequence_nr FROM {keyspace}.messages WHERE persistence_id = %s AND partition_nr = %s", (p, part)
        ):
            if r.sequence_nr is not None:
                out[r.sequence_nr] = part
    return out


# -- target_partition_size ---------------------------------------------------------------------


async def test_replay_across_partition_boundaries_from_every_seq_nr(target: str, cassandra_session: Any,
                                                                     keyspace: str) -> None:  # fmt: skip
    """Size 3; calls of 2, 3 (crosses a boundary), 1, 3, 3 (crosses), 1, 2 events. Every
    from_seq_nr replays exactly the rest, with pages smaller than a partition too."""
    p = pid()
    calls = [2, 3, 1, 3, 3, 1, 2]
    async with journal(target, target_partition_size=3, buffer_size=2) as j:
        first = 1
        for n in calls:
            envs = await j.persist(p, [f"e{first + k}" for k in range(n)])
            assert [e.seq_nr for e in envs] == list(range(first, first + n))
            first += n
        top = first - 1
        assert await j.highest_seq_nr(p) == top
        for start in range(1, top + 2):
            assert await seqs(j, p, start) == list(range(start, top + 1)), start
        got = [e.event async for e in j.current_events_by_persistence_id(p, 4, 9)]
        assert got == [f"e{n}" for n in range(4, 10)]
    # each call landed whole in one partition: partition_nr(first) + 1
    placed = await asyncio.to_thread(partitions_of, cassandra_session, keyspace, p, top)
    first = 1
    for n in calls:
        assert {placed[s] for s in range(first, first + n)} == {(first - 1) // 3 + 1}, (first, placed)
        first += n


async def test_deletes_and_writes_after_them_across_partitions(target: str) -> None:
    p = pid()
    async with journal(target, target_partition_size=3) as j:
        for n in (2, 3, 3):
            await j.persist(p, list(range(n)))
        await j.delete_events_to(p, 4)  # 4 sits in a partition after partition_nr(4)
        assert await seqs(j, p) == [5, 6, 7, 8]
        assert await j.highest_seq_nr(p) == 8
        await j.delete_events_to(p, 8)
        assert await seqs(j, p) == [] and await j.highest_seq_nr(p) == 8
        envs = await j.persist(p, ["a", "b", "c"], expected_seq_nr=8)
        assert [e.seq_nr for e in envs] == [9, 10, 11]
        for start in range(1, 13):
            assert await seqs(j, p, start) == list(range(max(start, 9), 12))


async def test_a_call_larger_than_a_partition_is_refused_before_any_io(target: str) -> None:
    p = pid()
    async with journal(target, target_partition_size=3) as j:
        with pytest.raises(InvalidArgument, match="target_partition_size=3"):
            await j.persist(p, [1, 2, 3, 4])
        assert await j.highest_seq_nr(p) == 0
        assert [x async for x in j.current_persistence_ids()].count(p) == 0


# -- consistency levels, authentication, datacenter ----------------------------------------------


async def test_consistency_levels_reach_the_server(target: str) -> None:
    """One node, replication factor 1: TWO cannot be met, so the server refuses: the settings are
    what the statements carry."""
    p = pid()
    async with journal(target, read_consistency="ONE", write_consistency="ALL") as j:
        await j.persist(p, ["ok"])
        assert await seqs(j, p) == [1]
    async with journal(target, write_consistency="TWO") as j:
        with pytest.raises(JournalUnavailable, match="Cannot achieve consistency level TWO") as info:
            await j.persist(p, ["refused"])
        assert info.value.outcome_unknown is False
    with pytest.raises(JournalUnavailable, match="Cannot achieve consistency level TWO"):
        async with journal(target, read_consistency="TWO") as j:  # opening reads already
            await j.highest_seq_nr(p)
    async with journal(target) as j:
        assert await seqs(j, p) == [1]  # nothing of the refused write


async def test_local_datacenter(target: str) -> None:
    p = pid()
    async with journal(target, local_datacenter="datacenter1") as j:
        await j.persist(p, ["x"])
        assert await seqs(j, p) == [1]
    with pytest.raises(ConfigurationError, match="'nowhere' is not one of the cluster's: \\['datacenter1'\\]"):
        async with journal(target, local_datacenter="nowhere"):
            pass


async def test_username_and_password(cassandra_auth_node: CassandraTarget) -> None:
    """A node with PasswordAuthenticator: a role made for the journal can write and read; a wrong
    password is a ConfigurationError, not an outage."""
    assert cassandra_auth_node.credentials is not None
    cluster = cassandra_auth_node.cluster()
    session = await asyncio.to_thread(cluster.connect)
    try:
        ks = await asyncio.to_thread(create_keyspace, session)
        await asyncio.to_thread(
            session.execute, "CREATE ROLE IF NOT EXISTS journal_app WITH PASSWORD = 'app-secret' AND LOGIN = true"
        )
        await asyncio.to_thread(session.execute, f"GRANT ALL PERMISSIONS ON KEYSPACE {ks} TO journal_app")
    finally:
        await asyncio.to_thread(cluster.shutdown)
    dsn = cassandra_auth_node.dsn(ks)
    p = pid()
    async with journal(dsn, username="journal_app", password="app-secret") as j:
        await j.persist(p, ["secret"], tags=["t"])
        assert [e.event async for e in j.current_events_by_persistence_id(p)] == ["secret"]
    with pytest.raises(ConfigurationError, match="authentication failed"):
        async with journal(dsn, username="journal_app", password="wrong"):
            pass
    with pytest.raises(ConfigurationError, match="authentication failed"):
        async with journal(dsn):  # no credentials at all
            pass


# -- batch sizes ---------------------------------------------------------------------------------


async def test_calls_above_the_batch_size_thresholds(target: str, cassandra_session: Any, keyspace: str) -> None:
    """Cassandra 5.0 fails batches above batch_size_fail_threshold (50 KiB) that span partitions;
    a call is ONE partition, so 200 events of 1 KiB (200 KiB) and one event of 300 KiB are
    stored whole, and their tag rows (batches cut at max_message_batch_bytes) too."""
    from cassandra import InvalidRequest
    from cassandra.query import BatchStatement, BatchType

    # the threshold is real on this node: the same bytes over two partitions are refused
    stmt = cassandra_session.prepare(
        f"INSERT INTO {keyspace}.messages (persistence_id, partition_nr, sequence_nr, timestamp, event) "
        "VALUES (?, ?, ?, now(), ?)"
    )
    batch = BatchStatement(batch_type=BatchType.UNLOGGED)
    for _ in range(60):
        batch.add(stmt, (pid("raw"), 0, 1, b"x" * 1024))  # 60 partitions, 60 KiB
    with pytest.raises(InvalidRequest, match="Batch too large"):
        await asyncio.to_thread(cassandra_session.execute, batch)

    p, q = pid("Big"), pid("Huge")
    many = ["x" * 1024 for _ in range(200)]
    async with journal(target, max_message_batch_bytes=64 * 1024) as j:
        envs = await j.persist(p, many, tags=["big"])
        assert [e.seq_nr for e in envs] == list(range(1, 201))
        await j.persist(q, ["y" * 300 * 1024], tags=["big"])
        assert [e.event async for e in j.current_events_by_persistence_id(p)] == many
        assert [len(e.event) async for e in j.current_events_by_persistence_id(q)] == [300 * 1024]
        tagged = [(e.persistence_id, e.seq_nr) async for e in j.current_events_by_tag("big")]
        assert tagged == [(p, n) for n in range(1, 201)] + [(q, 1)]
        assert j.backend.tag_writers.writer("big").batches_written >= 4  # 200 KiB cut into <= 64 KiB batches


async def test_a_call_above_max_write_bytes_is_refused_and_the_server_limit_is_real(target: str) -> None:
    """Above ``max_write_bytes`` (8 MiB) a call is refused before any I/O. Raised past the server's
    own limits (the request size, 1/40 of the node's heap here; the mutation size, 16 MiB), the
    server refuses the request: that is what the setting protects from. Nothing is stored."""
    p = pid()
    async with journal(target) as j:
        with pytest.raises(InvalidArgument, match="max_write_bytes"):
            await j.persist(p, ["z" * (5 * 1024 * 1024), "z" * (5 * 1024 * 1024)])
        assert await j.highest_seq_nr(p) == 0
    async with journal(target, max_write_bytes=64 * 1024 * 1024, max_event_bytes=64 * 1024 * 1024) as j:
        with pytest.raises(StorageError, match=r"exceeds allowed maximum|mutation"):
            await j.persist(p, ["z" * (17 * 1024 * 1024)])
        assert await j.highest_seq_nr(p) == 0


# -- the single-writer check ---------------------------------------------------------------------


async def test_a_second_writer_is_detected_and_writes_nothing(target: str) -> None:
    """Writer B reads the pid's state, writer A stores its call, then B stores from the stale
    state: B gets SequenceConflict and nothing of it is stored, also when A's call crossed into
    the next partition."""
    for size, first_call in ((500_000, 1), (3, 2)):
        p = pid()
        async with journal(target, target_partition_size=size) as a, journal(target, target_partition_size=size) as b:
            await a.persist(p, list(range(first_call)))
            stale = await b.backend.write_state(p)  # type: ignore[attr-defined]
            await a.persist(p, ["a1", "a2"])
            (req,) = Call.of(b._validator.call(p, ["b1"]))
            with pytest.raises(SequenceConflict, match="another writer"):
                await b.backend.store(req, stale)  # type: ignore[attr-defined]
            assert [e.event async for e in a.current_events_by_persistence_id(p)][-2:] == ["a1", "a2"]
            assert await seqs(a, p) == list(range(1, first_call + 3))


async def test_without_the_check_a_second_writer_duplicates_numbers(target: str) -> None:
    """What the check prevents: the same race with single_writer_check off stores both calls."""
    p = pid()
    async with journal(target, single_writer_check=False) as a, journal(target, single_writer_check=False) as b:
        await a.persist(p, ["a0"])
        stale = await b.backend.write_state(p)  # type: ignore[attr-defined]
        await a.persist(p, ["a1"])
        (req,) = Call.of(b._validator.call(p, ["b1"]))
        await b.backend.store(req, stale)  # type: ignore[attr-defined]
        stored = [(e.seq_nr, e.event) async for e in a.current_events_by_persistence_id(p)]
        assert sorted(stored) == [(1, "a0"), (2, "a1"), (2, "b1")]


async def test_racing_writers_never_share_a_number(target: str) -> None:
    """Two journals hammer the same pids; every acknowledged event is stored at its number, no
    number is stored twice, and the losers got SequenceConflict."""
    pids = [pid("Race") for _ in range(5)]
    acked: list[tuple[str, int, str]] = []
    conflicts = 0

    async def writer(j: Journal, name: str) -> None:
        nonlocal conflicts
        for i in range(12):
            for p in pids:
                try:
                    envs = await j.persist(p, [f"{name}{i}"])
                except SequenceConflict:
                    conflicts += 1
                    continue
                acked.append((p, envs[0].seq_nr, f"{name}{i}"))

    async with journal(target, target_partition_size=4) as a, journal(target, target_partition_size=4) as b:
        await asyncio.gather(writer(a, "a"), writer(b, "b"))
        for p in pids:
            stored = [(e.seq_nr, e.event) async for e in a.current_events_by_persistence_id(p)]
            assert [s for s, _ in stored] == list(range(1, len(stored) + 1))
            assert sorted(stored) == sorted((s, ev) for q, s, ev in acked if q == p)
    assert len(acked) + conflicts == 2 * 12 * len(pids)


# -- eventual_consistency_delay and the new-persistence-id scan ------------------------------------


async def test_eventual_consistency_delay_holds_events_back(target: str) -> None:
    """With a 1.5 s delay a current query does not see an event until it is 1.5 s old, and a live
    query delivers it no earlier than that."""
    tag = f"ecd{uuid.uuid4().hex[:8]}"
    async with journal(target, eventual_consistency_delay=1.5, query_refresh_interval=0.05) as j:
        envs = await j.persist(pid(), ["late"], tags=[tag])
        written = envs[0].db_timestamp.timestamp()
        assert [e async for e in j.current_events_by_tag(tag)] == []
        live = j.events_by_tag(tag)
        first = await asyncio.wait_for(anext(live), 10)
        seen_at = time.time()
        await live.aclose()  # type: ignore[attr-defined]
        assert first.event == "late" and seen_at - written >= 1.5
        assert [e.event async for e in j.current_events_by_tag(tag)] == ["late"]


async def test_new_persistence_id_scan_finds_late_rows_and_never_redelivers_before_the_offset(
    target: str,
) -> None:
    """A query resumed from an offset in the current bucket meets pid Y at tag number 2 after the
    offset-scanning period. Y's number 1 lies BEFORE the offset (already delivered to whoever
    resumes): it must not come again, and Y#2 is accepted. With scan timeout > 0 the query waits
    for missing numbers only while they may still arrive."""
    tag = f"nps{uuid.uuid4().hex[:8]}"
    y, z = pid("Y"), pid("Z")
    async with journal(target, new_persistence_id_scan_timeout=1.0, offset_scanning_period=0.05) as j:
        await j.persist(y, ["y1"], tags=[tag])
        zenv = await j.persist(z, ["z1"], tags=[tag])
        before = [e async for e in j.current_events_by_tag(tag)]
        assert [e.event for e in before] == ["y1", "z1"]
        offset = before[-1].offset
        assert isinstance(offset, TimeUUIDOffset) and zenv
        await asyncio.sleep(0.2)  # the scenario itself: Y's next row comes after the offset-scanning period
        await j.persist(y, ["y2"], tags=[tag])
        resumed = [e.event async for e in j.current_events_by_tag(tag, offset)]
        assert resumed == ["y2"]


async def test_new_persistence_id_scan_waits_for_a_late_first_row(target: str) -> None:
    """Y's tag row number 1 (earlier TimeUUID) becomes visible 0.5 s after its number 2: a query
    resumed in the current bucket holds Y#2, finds Y#1 within the 3 s scan timeout and delivers
    both in order (with a zero timeout it would hand out Y#2 alone)."""
    from journal.backend import TagRow
    from journal.buckets import bucket_of
    from journal.serialization import Serialized
    from journal.timeuuid import new_timeuuid

    tag = f"late{uuid.uuid4().hex[:8]}"
    y, z = pid("Y"), pid("Z")
    async with journal(target, new_persistence_id_scan_timeout=3.0, offset_scanning_period=0.05) as j:
        await j.persist(z, ["z1"], tags=[tag])
        offset = [e async for e in j.current_events_by_tag(tag)][-1].offset
        await asyncio.sleep(0.2)  # the scenario itself: Y's next row comes after the offset-scanning period
        u1, u2 = new_timeuuid(), new_timeuuid()
        store = j.backend.tag_store()  # type: ignore[attr-defined]
        size = j.settings.tags.bucket_size

        def row(n: int, u: uuid.UUID) -> TagRow:
            return TagRow(tag, bucket_of(u, size), u, y, n, n, "w", Serialized(0, "", f'"y{n}"'.encode()))

        await store.write_tag_rows([row(2, u2)])

        async def late() -> None:
            await asyncio.sleep(0.5)  # the scenario: the earlier row lands 0.5 s late
            await store.write_tag_rows([row(1, u1)])

        writing = asyncio.create_task(late())
        start = time.monotonic()
        resumed = [(e.persistence_id, e.seq_nr) async for e in j.current_events_by_tag(tag, offset)]
        await writing
        assert resumed == [(y, 1), (y, 2)]
        assert time.monotonic() - start < 3.0  # found, not accepted by the timeout


async def test_a_reference_keyspace_without_the_static_column_is_named_at_open(
    cassandra_node: CassandraTarget, cassandra_session: Any
) -> None:
    """A keyspace made by the reference's plugin lacks ``highest_sequence_nr``: opening says which
    ALTER TABLE adds it; after it, the journal works."""
    ks = await asyncio.to_thread(create_keyspace, cassandra_session)
    try:
        await asyncio.to_thread(cassandra_session.execute, f"ALTER TABLE {ks}.messages DROP highest_sequence_nr")
        with pytest.raises(ConfigurationError, match=f"ALTER TABLE {ks}.messages ADD highest_sequence_nr"):
            async with journal(cassandra_node.dsn(ks)):
                pass
        await asyncio.to_thread(
            cassandra_session.execute, f"ALTER TABLE {ks}.messages ADD highest_sequence_nr bigint static"
        )
        async with journal(cassandra_node.dsn(ks)) as j:
            await j.persist("A|1", ["ok"])
            assert await seqs(j, "A|1") == [1]
    finally:
        await asyncio.to_thread(cassandra_session.execute, f"DROP KEYSPACE IF EXISTS {ks}", timeout=60)


async def test_calls_of_one_pid_in_one_batch_are_numbered_one_after_another(target: str) -> None:
    """Group commit keeps one call per pid in flight; the backend does not rely on it: several
    calls of one pid handed over at once are written one after another, never racing."""
    p = pid()
    for check in (True, False):
        async with journal(target, single_writer_check=check, target_partition_size=4) as j:
            before = await j.highest_seq_nr(p)
            reqs = [j._validator.call(p, [f"{check}{i}", "x"]) for i in range(15)]
            results = await j.backend.write_batch(WriteBatch.concat(reqs))
            assert not results.errors
            firsts = sorted(results.first_seq_nrs)
            assert firsts == list(range(before + 1, before + 31, 2))
            assert await seqs(j, p) == list(range(1, before + 31))


async def test_events_placed_by_the_reference_plugin_replay_and_continue(
    target: str, cassandra_session: Any, keyspace: str
) -> None:
    """Rows as the reference's plugin places them (a call in the partition of its LAST event, no
    static column) replay from every number, and this journal continues after them."""
    from journal.serialization import SerializerRegistry

    p = pid("Ref")
    ser = SerializerRegistry().serialize("ref")
    stmt = await asyncio.to_thread(
        cassandra_session.prepare,
        f"INSERT INTO {keyspace}.messages (persistence_id, partition_nr, sequence_nr, timestamp, timebucket, "
        "writer_uuid, ser_id, ser_manifest, event_manifest, event) VALUES (?, ?, ?, now(), '0', 'jvm', ?, ?, '', ?)",
    )
    first = 1
    for n in (2, 3, 1, 3):  # the 3s cross boundaries: their rows sit one partition up
        for seq in range(first, first + n):
            await asyncio.to_thread(
                cassandra_session.execute, stmt, (p, (first + n - 2) // 3, seq, ser.ser_id, ser.manifest, ser.payload)
            )
        first += n
    async with journal(target, target_partition_size=3) as j:
        assert await j.highest_seq_nr(p) == 9
        for start in range(1, 11):
            assert await seqs(j, p, start) == list(range(start, 10))
        await j.persist(p, ["ours", "too"], expected_seq_nr=9)
        for start in range(1, 13):
            assert await seqs(j, p, start) == list(range(start, 12))
