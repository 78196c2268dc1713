"""The journal contract and the tag tests against a REAL Cassandra (never mocked).

Runs when CASSANDRA_CONTACT_POINTS is set (``docker compose up -d --wait`` starts one), e.g.
``CASSANDRA_CONTACT_POINTS=127.0.0.1 pytest -m cassandra tests/test_cassandra_journal.py``;
skipped with that reason otherwise.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import pytest

from journal import Journal, JournalSettings, UnsupportedOperation, open_journal

pytestmark = [
    pytest.mark.cassandra,
    pytest.mark.skipif(
        not os.environ.get("CASSANDRA_CONTACT_POINTS"),
        reason="no Cassandra: set CASSANDRA_CONTACT_POINTS (docker compose up -d cassandra) to run",
    ),
]


@pytest.fixture
async def cj() -> AsyncIterator[Journal]:
    from journal.cassandra.cql import schema_statements

    hosts = os.environ["CASSANDRA_CONTACT_POINTS"]
    ks = f"sj_{uuid.uuid4().hex[:10]}"
    from cassandra.cluster import Cluster

    cluster = Cluster(hosts.split(","))
    session = cluster.connect()
    for s in schema_statements(ks):
        session.execute(s)
    settings = JournalSettings.load(env={}, eventual_consistency_delay=0.0, query_refresh_interval=0.05)
    try:
        async with open_journal(f"cassandra://{hosts}/{ks}", settings=settings) as j:
            yield j
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}")
        cluster.shutdown()


async def test_persist_read_delete_snapshot(cj: Journal) -> None:
    envs = await cj.persist("Acc|1", [{"n": 1}, {"n": 2}])
    assert [e.seq_nr for e in envs] == [1, 2]
    assert await cj.highest_seq_nr("Acc|1") == 2
    assert [e.event async for e in cj.current_events_by_persistence_id("Acc|1")] == [{"n": 1}, {"n": 2}]
    await cj.delete_events_to("Acc|1", 1)
    assert [e.seq_nr async for e in cj.current_events_by_persistence_id("Acc|1")] == [2]
    assert await cj.highest_seq_nr("Acc|1") == 2
    await cj.save_snapshot("Acc|1", 2, {"s": 1})
    snap = await cj.load_snapshot("Acc|1")
    assert snap is not None and snap.state == {"s": 1}
    assert [p async for p in cj.current_persistence_ids()] == ["Acc|1"]


async def test_events_by_tag_exactly_once_in_order(cj: Journal) -> None:
    for i in range(5):
        for p in ("A|1", "A|2"):
            await cj.persist(p, [i], tags=["t"])
    got = [(e.persistence_id, e.seq_nr) async for e in cj.current_events_by_tag("t")]
    assert len(got) == len(set(got)) == 10
    for p in ("A|1", "A|2"):
        assert [s for q, s in got if q == p] == [1, 2, 3, 4, 5]


async def test_slice_queries_unsupported(cj: Journal) -> None:
    with pytest.raises(UnsupportedOperation, match="use events_by_tag"):
        cj.current_events_by_slices("A", 0, 1023)
