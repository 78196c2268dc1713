from journal import Journal


async def test_persist_and_replay(journal: Journal) -> None:
    envs = await journal.persist("cart|a", [{"n": 1}, {"n": 2}])
    assert [e.seq_nr for e in envs] == [1, 2]
    got = [e.event async for e in journal.current_events_by_persistence_id("cart|a")]
    assert got == [{"n": 1}, {"n": 2}]
