"""Replication core in one process: three locations (three databases), direct reads, no network.

The network and endpoint processes are tested in test_replication_processes.py; here the
algorithm: exactly once, transitivity, the vector check, progress in the write's transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from replication_helpers import Location, location_databases, open_location, open_locations

from journal.errors import IncompatibleVersion, LocationMismatch, ReplicationError
from journal.replication.replicator import LocalSource, ReadRequest, Replicator
from journal.replication.versions import Application
from journal.vector_time import VectorTime

LOG = "Cart"


@pytest.fixture(scope="module")
def dbs(server_dsn: str) -> Iterator[dict[str, str]]:
    with location_databases(server_dsn, ["A", "B", "C"]) as d:
        yield d


@pytest.fixture
async def locs(dbs: dict[str, str]) -> AsyncIterator[dict[str, Location]]:
    async with open_locations(dbs, [LOG]) as opened:
        yield opened


def pull(target: Location, source: Location, batch_size: int = 7) -> Replicator:
    return Replicator(target.store, LocalSource(source.store), LOG, batch_size=batch_size)


async def payloads(loc: Location) -> list[str]:
    """Every event of the log in the location's slice-query order."""
    out = []
    async for env in loc.journal.current_events_by_slices(LOG, 0, 1023):
        out.append(env.event["v"])
    return out


async def test_local_events_are_stamped_in_write_order_with_ticking_vector_time(locs: dict[str, Location]) -> None:
    a = locs["A"]
    for i in range(3):
        await a.journal.persist(f"{LOG}|c{i}", [{"v": f"a{i}"}])
    assert await a.store.stamp(LOG) == 3
    events, last = await a.store.read_log(LOG, 0, 100)
    assert last == 3
    assert [e.vector_time for e in events] == [VectorTime({"A": n}) for n in (1, 2, 3)]
    assert [(e.origin_location, e.origin_seq_nr, e.log_seq_nr) for e in events] == [("A", n, n) for n in (1, 2, 3)]
    assert await a.store.stamp(LOG) == 0  # idempotent
    assert await a.store.version_vector(LOG) == VectorTime({"A": 3})


async def test_concurrent_writes_converge_exactly_once_over_a_chain_and_a_ring(locs: dict[str, Location]) -> None:
    a, b, c = locs["A"], locs["B"], locs["C"]
    for loc in (a, b, c):
        await asyncio.gather(
            *(loc.journal.persist(f"{LOG}|{loc.name}{i % 4}", [{"v": f"{loc.name}{i}"}]) for i in range(20))
        )
    # chain A - B - C, both directions; then C - A closes a ring (the vector check must drop what comes back)
    links = [pull(b, a), pull(a, b), pull(c, b), pull(b, c), pull(a, c), pull(c, a)]
    for _ in range(3):
        for r in links:
            await r.catch_up()
    ids = [await loc.store.event_ids(LOG) for loc in (a, b, c)]
    assert ids[0] == ids[1] == ids[2]
    assert len(ids[0]) == 60 and set(ids[0].values()) == {1}
    for loc in (a, b, c):
        got = await payloads(loc)
        assert sorted(got) == sorted(f"{n}{i}" for n in "ABC" for i in range(20))
    vvs = {await loc.store.version_vector(LOG) for loc in (a, b, c)}
    assert len(vvs) == 1


async def test_causal_chain_is_delivered_in_order_everywhere(locs: dict[str, Location]) -> None:
    a, b, c = locs["A"], locs["B"], locs["C"]
    await a.journal.persist(f"{LOG}|x", [{"v": "e1"}])
    await pull(b, a).catch_up()
    await b.journal.persist(f"{LOG}|y", [{"v": "e2"}])  # B reacts to e1
    # C reads from B only: e1 reaches it transitively, before e2
    await pull(c, b, batch_size=1).catch_up()
    assert await payloads(c) == ["e1", "e2"]
    events, _ = await c.store.read_log(LOG, 0, 10)
    assert events[0].vector_time < events[1].vector_time


async def test_a_lost_progress_write_does_not_duplicate(locs: dict[str, Location]) -> None:
    a, b = locs["A"], locs["B"]
    for i in range(5):
        await a.journal.persist(f"{LOG}|p{i}", [{"v": i}])
    await pull(b, a).catch_up()
    conn = await asyncpg.connect(b.dsn)
    try:
        await conn.execute("DELETE FROM replication_progress")  # as if the progress had been lost
    finally:
        await conn.close()
    r = pull(b, a)
    assert await r.catch_up() == 0
    assert set((await b.store.event_ids(LOG)).values()) == {1}


async def test_progress_commits_with_the_events_or_not_at_all(locs: dict[str, Location]) -> None:
    a, b = locs["A"], locs["B"]
    await a.journal.persist(f"{LOG}|q", [{"v": 1}])
    await a.store.stamp(LOG)
    events, last = await a.store.read_log(LOG, 0, 10)
    other = {**_fields(events[0]), "persistence_id": "Other|z", "vector_time": VectorTime({"A": 2})}
    bad = [events[0], events[0].__class__(**other)]
    with pytest.raises(ReplicationError, match="does not belong"):
        await b.store.write_replicated(LOG, "A", bad, last)
    assert await b.store.progress(LOG, "A") == 0
    assert await b.store.event_ids(LOG) == {}


def _fields(e: object) -> dict[str, object]:
    return {k: getattr(e, k) for k in e.__slots__}  # type: ignore[attr-defined]


async def test_a_database_belongs_to_one_location(dbs: dict[str, str], locs: dict[str, Location]) -> None:
    with pytest.raises(LocationMismatch):
        async with open_location("Z", dbs["A"], [LOG]):
            pass


async def test_an_older_target_version_is_refused(locs: dict[str, Location]) -> None:
    source = LocalSource(locs["A"].store, Application("shop", "1.3"))
    request = ReadRequest(LOG, 0, 10, "B", VectorTime(), Application("shop", "1.2"))
    with pytest.raises(IncompatibleVersion, match="older"):
        await source.read(request)
    await source.read(ReadRequest(LOG, 0, 10, "B", VectorTime(), Application("other", "0.1")))
    await source.read(ReadRequest(LOG, 0, 10, "B", VectorTime(), Application("shop", "1.3.1")))


async def test_the_target_drops_what_it_already_stored(locs: dict[str, Location]) -> None:
    """Two sources deliver the same events (identities): the second copy is dropped, its progress kept."""
    a, b, c = locs["A"], locs["B"], locs["C"]
    for i in range(4):
        await a.journal.persist(f"{LOG}|r{i}", [{"v": i}])
    await pull(b, a).catch_up()
    await a.store.stamp(LOG)
    from_a, last_a = await a.store.read_log(LOG, 0, 100)
    from_b, last_b = await b.store.read_log(LOG, 0, 100)
    first = await c.store.write_replicated(LOG, "A", from_a, last_a)
    again = await c.store.write_replicated(LOG, "B", from_b, last_b)
    assert (first.written, first.dropped) == (4, 0)
    assert (again.written, again.dropped) == (0, 4)
    assert await c.store.progress(LOG, "B") == last_b
    assert set((await c.store.event_ids(LOG)).values()) == {1}


async def test_an_event_whose_vector_time_lacks_its_identity_is_still_dropped_when_it_comes_again(
    locs: dict[str, Location],
) -> None:
    """The target looks up only the identities its version vector covers (a catch-up's new
    events are past it), so every stored identity must be covered: even one an odd source sent
    with a vector time that lacks it. Before the vector folded identities in, the second copy
    was not looked up and its insert failed on the identity index (SequenceConflict)."""
    a, c = locs["A"], locs["C"]
    at = await a.store.log_seq_nr(LOG)
    await a.journal.persist(f"{LOG}|odd", [{"v": 1}])
    await a.store.stamp(LOG)
    events, last = await a.store.read_log(LOG, at, 10)
    odd = [events[0].__class__(**{**_fields(events[0]), "vector_time": VectorTime()})]
    first = await c.store.write_replicated(LOG, "A", odd, last)
    again = await c.store.write_replicated(LOG, "A", odd, last)
    assert (first.written, again.written, again.dropped) == (1, 0, 1)
    assert (await c.store.version_vector(LOG)).get("A") >= events[0].origin_seq_nr


async def test_filters_compose_and_private_events_never_leave(locs: dict[str, Location]) -> None:
    from journal.replication.filters import EndpointFilters, not_private, persistence_ids, tagged

    a, b, c = locs["A"], locs["B"], locs["C"]
    await a.journal.persist(f"{LOG}|1", [{"v": "public"}])
    await a.journal.persist(f"{LOG}|2", [{"v": "secret"}], tags=["private"])
    await a.journal.persist(f"{LOG}|3", [{"v": "for-b-only"}], tags=["b"])
    filters = EndpointFilters(
        all_logs=not_private("private"),
        target_locations={"C": ~tagged("b") & (persistence_ids(f"{LOG}|1") | tagged("c"))},
    )
    for target in (b, c):
        await Replicator(target.store, LocalSource(a.store, filters=filters), LOG).catch_up()
    assert sorted(await payloads(b)) == ["for-b-only", "public"]
    assert await payloads(c) == ["public"]
    # B passes on what it got; the private event is not there to pass on
    await Replicator(c.store, LocalSource(b.store), LOG).catch_up()
    assert sorted(await payloads(c)) == ["for-b-only", "public"]
    assert str(filters.for_read(LOG, "C")).startswith("ReplicationFilter((not tagged")


async def test_an_unmigrated_database_is_a_clear_configuration_error(server_dsn: str) -> None:
    from journal.errors import ConfigurationError
    from journal.postgres.migrations import upgrade
    from tests.support.scratch import admin, with_database

    name = "sjrepl_old_schema"
    await admin(server_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin(server_dsn, f'CREATE DATABASE "{name}"')
    try:
        db = with_database(server_dsn, name)
        await asyncio.to_thread(upgrade, db, "public", "0004")
        with pytest.raises(ConfigurationError, match="journal migrate"):
            async with open_location("A", db, [LOG]):
                pass
    finally:
        await admin(server_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def test_a_local_write_does_not_cover_what_arrived_after_it(locs: dict[str, Location]) -> None:
    """A's write and B's write of one entity are concurrent; B's arrives at A before A's endpoint
    stamped A's (it was away, or just slower than the pull). A's event is stamped before the
    batch is stored, so its vector time does not cover B's, and the replicated entity at A
    marks the pair concurrent (before, A's vector time covered B's: ordered, no conflict seen)."""
    from journal.replication.entity import ReplicatedEntities, ReplicatedEntity

    class Register(ReplicatedEntity[str]):
        entity_type = LOG

        def initial_state(self) -> str:
            return ""

        def on_event(self, state: str, event: dict[str, str]) -> str:
            return event["v"]

    a, b = locs["A"], locs["B"]
    await a.journal.persist(f"{LOG}|x", [{"v": "written at A"}])  # not stamped yet
    await b.journal.persist(f"{LOG}|x", [{"v": "written at B"}])
    await pull(a, b).catch_up()  # B's event arrives at A after A's write
    assert await a.store.stamp(LOG) == 0  # A's was stamped by the batch, before it
    events, _ = await a.store.read_log(LOG, 0, 10)
    assert [(e.origin_location, e.vector_time) for e in events] == [
        ("A", VectorTime({"A": 1})),
        ("B", VectorTime({"B": 1})),
    ]
    state = await ReplicatedEntities(a.journal, a.store).load(Register("x"))
    assert [v.concurrent for v in state.versions] == [False, True]
