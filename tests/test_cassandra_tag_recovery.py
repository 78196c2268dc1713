"""The Cassandra tag writers' recovery against a write of the same pid that lands late.

Found with two group-commit batches in flight and a node killed mid-write
(``tests/test_cassandra_faults.py``): a call whose outcome was unknown (a client-side timeout)
was applied by the node a moment later; the pid's next call recovered its tag rows *before* that
event was readable, then read the stored highest *after* it landed, wrote the next event and
numbered its tag row in the late event's place. The late event never got a tag row, and the
numbers stayed gap-free, so no reader could notice (seen: rows (130, 130), (132, 131), ...).

The interleaving is driven here step by step: the store the tag writers read from lets the late
write land right after the recovery's read of the pid's events."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from cassandra_fixtures import recent_first_bucket
from tag_backends import CassandraRaw

from journal import JournalSettings, SequenceConflict, open_journal
from journal.buckets import bucket_of
from journal.timeuuid import timeuuid_for_event

pytestmark = pytest.mark.cassandra


class LandsAfterTheRecoveryRead:
    """The tag writers' real store; once armed, its next read of a pid's events is followed by
    ``land()`` (the late write) before the read's result is returned."""

    def __init__(self, real: Any, land: Any) -> None:
        self._real = real
        self._land = land
        self.armed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    async def tagged_events(self, persistence_id: str, from_seq_nr: int, limit: int) -> Any:
        rows = await self._real.tagged_events(persistence_id, from_seq_nr, limit)
        if self.armed:
            self.armed = False
            await self._land()
        return rows


async def test_a_write_landing_after_the_recovery_read_is_never_numbered_over(
    cassandra_dsn: str, cassandra_session: Any
) -> None:
    ks = cassandra_dsn.rsplit("/", 1)[1]
    raw = CassandraRaw(cassandra_session, ks)
    pid = "Late|1"
    settings = JournalSettings.load(env={}, first_time_bucket=recent_first_bucket(), eventual_consistency_delay=0.0)
    backend: Any = None

    async def land() -> None:  # what the unknown-outcome call's batch does: its event and the partition's highest
        part = backend.layout.write_partition(2)
        u = timeuuid_for_event(datetime.now(UTC), pid, 2)
        cassandra_session.execute(
            f"INSERT INTO {ks}.messages (persistence_id, partition_nr, sequence_nr, timestamp, timebucket, "
            "writer_uuid, ser_id, ser_manifest, event_manifest, event, tags) "
            "VALUES (%s, %s, 2, %s, %s, 'other', 1, '', '', %s, {'late'})",
            (pid, part, u, str(bucket_of(u, settings.tags.bucket_size)), b'"late"'),
        )
        cassandra_session.execute(
            f"UPDATE {ks}.messages SET highest_sequence_nr = 2 WHERE persistence_id = %s AND partition_nr = %s",
            (pid, part),
        )

    async with open_journal(cassandra_dsn, settings=settings) as j:
        backend = j.backend
        await j.persist(pid, ["first"], tags=["late"])
        store = LandsAfterTheRecoveryRead(backend.tag_writers.store, land)
        backend.tag_writers.store = store
        # the second call's outcome was unknown: the journal forgets the pid's state and tag numbering
        backend.forget(pid)
        backend.tag_writers.forget(pid)
        store.armed = True
        try:
            await j.persist(pid, ["third"], tags=["late"])
        except SequenceConflict:  # the late event took the number: the caller writes again
            await j.persist(pid, ["third"], tags=["late"])
        assert not store.armed, "the late write landed"
        stored = [e.seq_nr async for e in j.current_events_by_persistence_id(pid)]
        rows = sorted((r[3], r[2]) for r in await raw.tag_rows() if r[1] == pid)
        assert rows == [(s, s) for s in stored] == [(1, 1), (2, 2), (3, 3)], "every event's tag row, numbered in order"
        got = [e.seq_nr async for e in j.current_events_by_tag("late")]
        assert got == stored
