"""Spark reads of the current durable states by slice range (issue 34), against real PostgreSQL:
one partition per slice range, decoded as the journal's Spark reads are (its codec, a forgotten
subject flagged), over several databases where each range is stored."""

from __future__ import annotations

from typing import Any

import pytest
import test_spark
from test_spark import MASTER_KEY

from journal import Journal, JournalSettings, open_journal, slice_for

pyspark = pytest.importorskip("pyspark", reason="the 'spark' extra is not installed")

from projections.spark import decode_states, jdbc_source, read_states  # noqa: E402

pytestmark = pytest.mark.spark
spark = test_spark.spark  # the session's SparkSession
source = test_spark.source


async def test_current_states_are_read_one_partition_per_slice_range(journal: Journal, spark: Any, source: Any) -> None:
    """Every pid's latest revision once, tombstones only when asked for. Before: no read_states."""
    store = journal.durable_state()
    latest: dict[str, int] = {}
    for i in range(60):
        pid = f"Acct|{i}"
        for r in range(1, i % 3 + 2):
            await store.upsert(pid, r, {"owner": f"o{i}", "balance": i * 10 + r})
        latest[pid] = i % 3 + 1
    for i in range(5):
        await store.delete(f"Acct|{i}", latest[f"Acct|{i}"] + 1)
    await store.upsert("Other|x", 1, {"owner": "x", "balance": 0})
    df = read_states(spark, source, "Acct", partitions=4)
    assert df.rdd.getNumPartitions() == 4
    got = {(r.persistence_id, r.revision) for r in df.select("persistence_id", "revision").collect()}
    assert got == {(p, n) for p, n in latest.items() if int(p.split("|")[1]) >= 5}
    all_rows = read_states(spark, source, "Acct", partitions=4, include_deleted=True).select("persistence_id").count()
    assert all_rows == 60
    decoded = {r.persistence_id: r for r in decode_states(df).collect()}
    for pid, r in decoded.items():
        i = int(pid.split("|")[1])
        assert (r.revision, r.state.owner, r.state.balance, r.forgotten) == (
            latest[pid],
            f"o{i}",
            i * 10 + latest[pid],
            False,
        )
    with pytest.raises(ValueError, match="unknown durable state columns"):
        read_states(spark, source, "Acct", columns=["seq_nr"])


async def test_encrypted_states_are_decrypted_and_a_forgotten_subjects_flagged(
    journal: Journal, spark: Any, source: Any, dsn: str
) -> None:
    from projections.spark.payloads import PayloadReader
    from tests.hooks_app import customer

    settings = JournalSettings.load(env={}, dsn=dsn, encrypt=True, master_key=MASTER_KEY)
    async with open_journal(dsn, settings=settings, subject_of=customer) as j:
        store = j.durable_state()
        for pid in ("Yrs|ann-1", "Yrs|bob-1", "Yrs|bob-2"):
            await store.upsert(pid, 1, {"note": f"secret {pid}"})
        assert await j.forget("YrsCust|ann")
        reader = PayloadReader.of(j, source)
    raw = read_states(spark, source, "Yrs", partitions=2)
    rows = {r.persistence_id: r for r in decode_states(raw, payloads=reader).collect()}
    assert {p: (r.forgotten, r.state.note if r.state else None) for p, r in rows.items()} == {
        "Yrs|ann-1": (True, None),
        "Yrs|bob-1": (False, "secret Yrs|bob-1"),
        "Yrs|bob-2": (False, "secret Yrs|bob-2"),
    }
    with pytest.raises(Exception, match="sealed payload"):  # without the codec: refused, not null
        decode_states(raw).collect()


async def test_states_are_read_where_each_range_is_stored(parts: list[str], spark: Any) -> None:
    """Two databases, then 512-767 moved to a third: each state read once, from where it is."""
    from journal.backends import open_partitioned
    from journal.partitioned.move import SliceMove
    from projections.spark import placement

    settings = JournalSettings.load(env={}, databases=parts[:2])
    pids = [f"Acct|{i}" for i in range(200)]
    async with open_journal(settings=settings) as j:
        store = j.durable_state()
        for p in pids:
            await store.upsert(p, 1, {"owner": p, "balance": 1})
        mover = await open_partitioned(parts[0], settings)
        try:
            await SliceMove(mover, 512, 767, parts[2]).run()
        finally:
            await mover.close()
        for p in pids[:50]:
            await store.upsert(p, 2, {"owner": p, "balance": 2})
        placed = await placement(j)
    df = read_states(spark, placed, "Acct", partitions=2)
    assert df.rdd.getNumPartitions() == 3  # 512-1023 spans two databases: cut in two
    got = [(r.persistence_id, r.revision) for r in df.select("persistence_id", "revision").collect()]
    assert sorted(got) == sorted((p, 2 if i < 50 else 1) for i, p in enumerate(pids))
    on_third = {r.persistence_id for r in read_states(spark, jdbc_source(parts[2]), "Acct").collect()}
    assert on_third == {p for p in pids if 512 <= slice_for(p) <= 767}
