"""Spark pipelines against a real PostgreSQL, with one local SparkSession for the module."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from journal import Journal, JournalSettings, SparkSetupError, slice_for
from journal.settings import SparkSettings
from tests.support.waiting import wait_until

pyspark = pytest.importorskip("pyspark", reason="the 'spark' extra is not installed")

from projections.spark import (  # noqa: E402
    decode_events,
    export_parquet,
    find_java,
    find_jdbc_driver,
    jdbc_source,
    journal_predicates,
    read_journal,
    spark_session,
    write_read_model,
)

pytestmark = pytest.mark.spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One small local SparkSession for every Spark test (2 cores, 1g, few shuffle partitions)."""
    settings = JournalSettings.load(env={}, master="local[2]", shuffle_partitions=2)
    try:
        session = spark_session(settings.spark)
    except SparkSetupError as e:
        if os.environ.get("CI"):  # .ci/run installs Java and the driver: there, missing is a failure
            raise
        pytest.skip(f"Spark cannot start here: {e}")
    yield session
    session.stop()


@pytest.fixture
def source(dsn: str) -> Any:
    return jdbc_source(dsn)


@dataclass
class Deposited:
    amount: int
    currency: str


@dataclass
class Withdrawn:
    amount: int
    reason: str


async def _fill(journal: Journal, n_pids: int = 60, per_pid: int = 3) -> dict[str, int]:
    expected: dict[str, int] = {}
    for i in range(n_pids):
        pid = f"acct|{i}"
        await journal.persist(
            pid,
            [{"amount": i * 10 + k, "currency": "EUR"} for k in range(per_pid)],
            tags=[f"t{i % 3}"],
            metadata={"user": f"u{i}"},
        )
        expected[pid] = per_pid
    await journal.persist("other|x", [{"amount": 1, "currency": "USD"}])
    return expected


def _ranges(predicates: list[str]) -> list[tuple[int, int]]:
    out = []
    for p in predicates:
        m = re.search(r"slice BETWEEN (\d+) AND (\d+)", p)
        assert m, p
        out.append((int(m.group(1)), int(m.group(2))))
    return out


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 1024])
def test_predicates_cover_every_slice_exactly_once(n: int) -> None:
    preds = journal_predicates("acct", n)
    assert len(preds) == n
    covered = [s for lo, hi in _ranges(preds) for s in range(lo, hi + 1)]
    assert sorted(covered) == list(range(1024))
    assert all(p.startswith("entity_type = 'acct' AND ") for p in preds)


def test_predicates_quote_values_and_window() -> None:
    t0 = datetime(2024, 5, 1, tzinfo=UTC)
    (p,) = journal_predicates("o'brien", 1, t0, t0 + timedelta(hours=1))
    assert "entity_type = 'o''brien'" in p
    assert "db_timestamp >= '2024-05-01T00:00:00+00:00'::timestamptz" in p
    assert "db_timestamp < '2024-05-01T01:00:00+00:00'::timestamptz" in p
    with pytest.raises(ValueError, match="divide"):
        journal_predicates("acct", 3)
    with pytest.raises(ValueError, match="empty time window"):
        journal_predicates("acct", 2, t0, t0)


async def test_reader_partitions_read_every_row_once(journal: Journal, spark: Any, source: Any) -> None:
    from pyspark.sql import functions as F

    expected = await _fill(journal)
    df = read_journal(spark, source, "acct", partitions=8, fetch_size=7)
    assert df.rdd.getNumPartitions() == 8
    rows = df.select("persistence_id", "seq_nr").collect()
    keys = [(r.persistence_id, r.seq_nr) for r in rows]
    assert len(keys) == len(set(keys)) == sum(expected.values())
    assert {k[0] for k in keys} == set(expected)
    # each Spark partition holds exactly the slices of its range
    per_part = (
        df.withColumn("p", F.spark_partition_id())
        .groupBy("p")
        .agg(F.min("slice").alias("lo"), F.max("slice").alias("hi"))
        .collect()
    )
    for r in per_part:
        assert r.p * 128 <= r.lo <= r.hi < (r.p + 1) * 128


async def test_reader_pushes_column_projection_and_time_window(journal: Journal, spark: Any, source: Any) -> None:
    await _fill(journal, n_pids=10, per_pid=2)
    df = read_journal(spark, source, "acct", partitions=2, columns=["persistence_id", "seq_nr"])
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "ReadSchema: struct<persistence_id:string,seq_nr:bigint>" in plan
    assert df.columns == ["persistence_id", "seq_nr"]
    ts = sorted(r.db_timestamp for r in read_journal(spark, source, "acct", columns=["db_timestamp"]).collect())
    cut = ts[len(ts) // 2].replace(tzinfo=UTC)
    before = read_journal(spark, source, "acct", to_timestamp=cut).count()
    after = read_journal(spark, source, "acct", from_timestamp=cut).count()
    assert before + after == 20 and before > 0 and after > 0
    with pytest.raises(ValueError, match="unknown journal columns"):
        read_journal(spark, source, "acct", columns=["nope"])


async def test_decoding_typed_columns_tags_and_metadata(journal: Journal, spark: Any, source: Any) -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    await journal.persist(
        "acct|a",
        [Deposited(100, "EUR"), Withdrawn(30, "rent")],
        tags=["vip"],
        metadata={"user": "ann"},
    )
    await journal.persist("acct|b", [{"amount": 5, "currency": "SEK"}])
    await journal.persist("acct|c", [b"\x00raw"])
    raw = read_journal(spark, source, "acct", partitions=4)

    dep = f"{Deposited.__module__}:{Deposited.__qualname__}"
    wd = f"{Withdrawn.__module__}:{Withdrawn.__qualname__}"
    schemas = {
        dep: StructType([StructField("amount", LongType()), StructField("currency", StringType())]),
        wd: StructType([StructField("amount", LongType()), StructField("reason", StringType())]),
    }
    typed = decode_events(raw, schemas)
    assert dict(typed.select("event.*").dtypes) == {
        "amount": "bigint",
        "currency": "string",
        "reason": "string",
    }
    got = {(r.persistence_id, r.seq_nr): r for r in typed.collect()}
    a1, a2 = got[("acct|a", 1)], got[("acct|a", 2)]
    assert (a1.event_type, a1.event.amount, a1.event.currency) == (dep, 100, "EUR")
    assert (a2.event_type, a2.event.amount, a2.event.reason) == (wd, 30, "rent")
    assert a1.tags == ["vip"] and a1.metadata.user == "ann"
    assert got[("acct|c", 1)].event is None  # bytes serializer: not JSON
    assert got[("acct|b", 1)].metadata is None

    inferred = decode_events(raw)
    fields = dict(inferred.select("event.*").dtypes)
    assert fields["amount"] == "bigint" and fields["currency"] == "string" and fields["reason"] == "string"
    assert {r.event.currency for r in inferred.collect() if r.event is not None} == {
        "EUR",
        None,
        "SEK",
    }


async def _table(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


async def test_writer_replace_merge_idempotent_and_failure_leaves_target(
    journal: Journal, spark: Any, source: Any, dsn: str
) -> None:
    from pyspark.sql import functions as F

    await _fill(journal, n_pids=12, per_pid=2)
    events = decode_events(read_journal(spark, source, "acct", partitions=4))
    model = events.groupBy("persistence_id").agg(F.sum("event.amount").alias("total"), F.count("*").alias("n"))
    for _ in range(2):  # twice: same result
        res = await write_read_model(model, source, "spark_totals", key=["persistence_id"], batch_size=5)
        assert res.rows == 12
    rows = await _table(dsn, "SELECT persistence_id, total, n FROM spark_totals ORDER BY persistence_id")
    assert len(rows) == 12 and rows[0] == ("acct|0", 1, 2)

    one = spark.createDataFrame([("acct|0", 999, 1), ("new|1", 1, 1)], "persistence_id string, total long, n long")
    await write_read_model(one, source, "spark_totals", key=["persistence_id"], mode="merge")
    rows2 = dict((r[0], r[1]) for r in await _table(dsn, "SELECT persistence_id, total FROM spark_totals"))
    assert len(rows2) == 13 and rows2["acct|0"] == 999 and rows2["new|1"] == 1

    @F.udf("long")
    def boom(x: int) -> int:
        raise RuntimeError("job failed half-way")

    with pytest.raises(Exception, match="job failed half-way"):
        await write_read_model(model.withColumn("total", boom("total")), source, "spark_totals", key=["persistence_id"])
    assert dict((r[0], r[1]) for r in await _table(dsn, "SELECT persistence_id, total FROM spark_totals")) == rows2
    left = await _table(dsn, "SELECT tablename FROM pg_tables WHERE tablename LIKE '\\_spark\\_staging%'")
    assert left == []


async def test_export_parquet_partitioned_by_slice_range(
    journal: Journal, spark: Any, source: Any, tmp_path: Path
) -> None:
    expected = await _fill(journal, n_pids=40, per_pid=2)
    out = export_parquet(read_journal(spark, source, "acct", partitions=4), tmp_path / "out", partitions=4)
    dirs = sorted(p.name for p in out.iterdir() if p.is_dir())
    wanted = {f"slice_range={lo:04d}-{hi:04d}" for lo, hi in [(0, 255), (256, 511), (512, 767), (768, 1023)]}
    present = {
        f"slice_range={(slice_for(p) // 256) * 256:04d}-{(slice_for(p) // 256) * 256 + 255:04d}" for p in expected
    }
    assert set(dirs) == present and present <= wanted
    back = spark.read.parquet(str(out))
    assert back.count() == sum(expected.values())
    for r in back.select("persistence_id", "slice_range").distinct().collect():
        lo = int(r.slice_range[:4])
        assert lo <= slice_for(r.persistence_id) <= lo + 255
    with pytest.raises(ValueError, match="not empty"):
        export_parquet(read_journal(spark, source, "acct"), out)
    by_date = export_parquet(read_journal(spark, source, "acct"), tmp_path / "d", partition_by="date")
    today = datetime.now(UTC).date().isoformat()
    assert any(p.name in (f"date={today}",) or p.name.startswith("date=") for p in by_date.iterdir())


def test_missing_driver_and_java_errors_say_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(SparkSetupError) as e:
        find_jdbc_driver(SparkSettings(), candidates=[str(tmp_path / "none.jar")], probe_maven=False)
    msg = str(e.value)
    assert "no PostgreSQL JDBC driver found" in msg
    assert "apt-get install libpostgresql-jdbc-java" in msg and "JOURNAL_SPARK_JDBC_JAR" in msg
    assert "org.postgresql:postgresql" in msg
    with pytest.raises(SparkSetupError, match="does not exist"):
        find_jdbc_driver(SparkSettings(jdbc_jar=str(tmp_path / "x.jar")), probe_maven=False)
    jar = tmp_path / "postgresql.jar"
    jar.write_bytes(b"PK")
    assert find_jdbc_driver(SparkSettings(), candidates=[str(jar)], probe_maven=False).jar == jar
    with pytest.raises(SparkSetupError, match="default-jre-headless"):
        find_java({"PATH": str(tmp_path)})
    with pytest.raises(SparkSetupError, match="Unix socket"):
        jdbc_source("postgresql://postgres:@/postgres?host=/tmp/x", local=False)


# -- backfill with hand-over to the online projection ------------------------------------------

TOTALS_DDL = "CREATE TABLE IF NOT EXISTS {t} (persistence_id text PRIMARY KEY, total bigint, n bigint)"


def _online_handler(table: str) -> Any:
    async def handler(conn: Any, envelopes: Any) -> None:
        await conn.execute(TOTALS_DDL.format(t=table))
        for env in envelopes:
            await conn.execute(
                f"INSERT INTO {table} (persistence_id, total, n) VALUES ($1, $2, 1) "
                f"ON CONFLICT (persistence_id) DO UPDATE SET total = {table}.total + EXCLUDED.total, "
                f"n = {table}.n + 1",
                env.persistence_id,
                env.event["amount"],
            )

    return handler


def totals_job(events: Any) -> Any:
    """The Spark twin of the online handler (used by the test and by the CLI example)."""
    from pyspark.sql import functions as F

    from projections.spark.backfill import ReadModel

    frame = events.groupBy("persistence_id").agg(
        F.sum("event.amount").cast("long").alias("total"), F.count("*").alias("n")
    )
    return ReadModel(frame=frame, table="bf_totals", key=["persistence_id"])


async def _run_until(
    journal: Journal, settings: JournalSettings, name: str, table: str, dsn: str, want: dict[str, tuple[int, int]]
) -> dict[str, tuple[int, int]]:
    import asyncio

    from projections import Worker

    w = Worker(journal, journal.settings, name, "acct", _online_handler(table), "grouped")
    task = asyncio.create_task(w.run())
    got: dict[str, tuple[int, int]] = {}

    async def reached_or_failed() -> bool:
        nonlocal got
        try:
            got = {r[0]: (r[1], r[2]) for r in await _table(dsn, f"SELECT persistence_id, total, n FROM {table}")}
        except asyncpg.UndefinedTableError:
            got = {}
        return got == want or task.done()

    try:
        with contextlib.suppress(AssertionError):  # timed out: the caller compares got with want (a diff)
            await wait_until(reached_or_failed, 60, f"the online projection to fill {table}", every=0.1)
    finally:
        w.stop()
        await asyncio.wait_for(task, 30)
    return got


async def test_backfill_hands_over_to_online_projection(
    journal: Journal, settings: JournalSettings, spark: Any, source: Any, dsn: str
) -> None:
    from projections.spark.backfill import backfill

    expected: dict[str, tuple[int, int]] = {}

    async def write(pid: str, amounts: list[int]) -> None:
        await journal.persist(pid, [{"amount": a, "currency": "EUR"} for a in amounts])
        t, n = expected.get(pid, (0, 0))
        expected[pid] = (t + sum(amounts), n + len(amounts))

    for i in range(30):
        await write(f"acct|{i}", [i, 1, 2])
    res = await backfill(spark, journal, source, "bf", "acct", totals_job, partitions=4)
    assert res.events == 90 and res.rows_written == 30 and res.table == "bf_totals"
    after_backfill = {r[0]: (r[1], r[2]) for r in await _table(dsn, "SELECT persistence_id, total, n FROM bf_totals")}
    assert after_backfill == expected
    offsets = await _table(
        dsn,
        "SELECT count(*), min(timestamp_offset), max(timestamp_offset) "
        "FROM projection_timestamp_offset_store WHERE projection_name = 'bf'",
    )
    assert offsets[0][0] == 1024 and offsets[0][1] == offsets[0][2] == res.cutoff

    for i in range(20, 40):  # old pids continue, new pids start, all after the cut-off
        await write(f"acct|{i}", [100 + i, 3])
    online = await _run_until(journal, settings, "bf", "bf_totals", dsn, expected)
    assert online == expected  # backfill + online continuation

    reference = await _run_until(journal, settings, "ref", "ref_totals", dsn, expected)
    assert reference == online  # == the online projection from the start


async def test_interrupted_backfill_leaves_offsets_and_read_model(
    journal: Journal, spark: Any, source: Any, dsn: str
) -> None:
    from pyspark.sql import functions as F

    from projections.spark.backfill import ReadModel, backfill

    await _fill(journal, n_pids=10, per_pid=2)
    await backfill(
        spark,
        journal,
        source,
        "bf2",
        "acct",
        lambda ev: ReadModel(totals_job(ev).frame, "bf2_totals", ["persistence_id"]),
    )
    before_rows = await _table(dsn, "SELECT * FROM bf2_totals ORDER BY 1")
    before_offsets = await _table(
        dsn, "SELECT * FROM projection_timestamp_offset_store WHERE projection_name = 'bf2' ORDER BY slice"
    )
    await journal.persist("acct|late", [{"amount": 1, "currency": "EUR"}])

    @F.udf("long")
    def crash(x: int) -> int:
        raise RuntimeError("killed half-way")

    def failing(ev: Any) -> Any:
        m = totals_job(ev)
        return ReadModel(m.frame.withColumn("total", crash("total")), "bf2_totals", ["persistence_id"])

    with pytest.raises(Exception, match="killed half-way"):
        await backfill(spark, journal, source, "bf2", "acct", failing)
    assert await _table(dsn, "SELECT * FROM bf2_totals ORDER BY 1") == before_rows
    assert (
        await _table(
            dsn, "SELECT * FROM projection_timestamp_offset_store WHERE projection_name = 'bf2' ORDER BY slice"
        )
        == before_offsets
    )


# -- the command line --------------------------------------------------------------------------


def test_cli_export_backfill_and_unknown_entity_type(
    dsn: str, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from conftest import truncate_all
    from typer.testing import CliRunner

    from journal import open_journal
    from projections.cli import app

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))  # for examples.spark_totals

    async def seed() -> None:
        await truncate_all(dsn)
        async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
            for i in range(8):
                await j.persist(f"acct|c{i}", [{"amount": i}, {"amount": 1}])

    asyncio.run(seed())
    runner = CliRunner()
    common = ["--dsn", dsn, "--master", "local[2]", "--partitions", "4"]
    r = runner.invoke(app, ["spark-export", "--entity-type", "nope", "--out", str(tmp_path / "x"), *common])
    assert r.exit_code == 2 and "error: unknown entity type 'nope'" in r.output and "acct (16)" in r.output

    r = runner.invoke(app, ["spark-export", "--entity-type", "acct", "--out", str(tmp_path / "e"), *common])
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "exported 16 events of acct in 4 partitions" in r.output
    assert all(p.name.startswith("slice_range=") for p in (tmp_path / "e").iterdir() if p.is_dir())

    r = runner.invoke(
        app, ["spark-backfill", "totals", "--entity-type", "acct", "--job", "examples.spark_totals:job", *common]
    )
    assert r.exit_code == 0, r.output + repr(r.exception)
    assert "16 events read in 4 partitions, 8 rows written to totals" in r.output
    rows = asyncio.run(_table(dsn, "SELECT sum(total), sum(n) FROM totals"))
    assert rows == [(sum(range(8)) + 8, 16)]


async def test_reader_over_several_databases_reads_each_range_where_it_is_stored(
    parts: list[str], spark: Any, tmp_path: Path
) -> None:
    """Two servers, then a range moved to a third: one Spark partition per slice range on the
    database that holds it, every row read once (a read of the first database alone misses)."""
    from journal import Write, open_journal
    from journal.backends import open_partitioned
    from journal.partitioned.move import SliceMove
    from journal.postgres import without_password
    from projections.spark import placement, spark_ranges

    settings = JournalSettings.load(env={}, databases=parts[:2])
    async with open_journal(settings=settings) as j:
        quarters: dict[int, list[str]] = {0: [], 1: [], 2: [], 3: []}  # 20 pids in each quarter of the slices
        for i in range(100_000):
            if len(its := quarters[slice_for(f"acct|{i}") // 256]) < 20:
                its.append(f"acct|{i}")
        expected = {p: 2 for its in quarters.values() for p in its}
        assert len(expected) == 80
        await j.persist_many([Write(p, [{"amount": 1, "currency": "EUR"}] * 2) for p in expected])
        placed = await placement(j)
        assert [(p.source.dsn, p.min_slice, p.max_slice) for p in placed] == [(parts[0], 0, 511), (parts[1], 512, 1023)]
        assert [(r.min_slice, r.max_slice) for r in spark_ranges(placed, 1)] == [(0, 511), (512, 1023)]

        def keys(df: Any) -> list[tuple[str, int]]:
            return [(r.persistence_id, r.seq_nr) for r in df.select("persistence_id", "seq_nr").collect()]

        df = read_journal(spark, placed, "acct", partitions=4)
        assert df.rdd.getNumPartitions() == 4
        got = keys(df)
        assert len(got) == len(set(got)) == sum(expected.values()) and {k[0] for k in got} == set(expected)
        mover = await open_partitioned(parts[0], settings)
        try:
            await SliceMove(mover, 512, 767, parts[2]).run()
        finally:
            await mover.close()
        placed = await placement(j)
    # the target's DSN is the one its map row names (without a password)
    assert [(without_password(p.source.dsn), p.min_slice, p.max_slice) for p in placed] == [
        (without_password(d), lo, hi) for d, lo, hi in ((parts[0], 0, 511), (parts[2], 512, 767), (parts[1], 768, 1023))
    ]
    df = read_journal(spark, placed, "acct", partitions=2)  # 512-1023 spans two databases: cut in two
    assert df.rdd.getNumPartitions() == 3
    got = keys(df)
    assert len(got) == len(set(got)) == sum(expected.values())
    moved = {k for k in got if 512 <= slice_for(k[0]) <= 767}
    assert moved and moved.isdisjoint(keys(read_journal(spark, jdbc_source(parts[1]), "acct")))
    with pytest.raises(ValueError, match="cover slices 0-1023 once"):
        read_journal(spark, placed[:2], "acct")


# -- payloads read as the journal reads them: codec, serializers, upcasters (issue 32, item 5) -----

MASTER_KEY = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="  # base64 of bytes 0..31 (a test key)


async def _customer_journal(dsn: str) -> tuple[JournalSettings, dict[str, list[int]]]:
    """Version-1 orders of three customers, encrypted with each customer's key (wrapped with a
    master key); ann is then forgotten. Returns the settings and the quantities by pid."""
    from journal import open_journal
    from tests.hooks_app import PlacedV1, customer

    settings = JournalSettings.load(env={}, dsn=dsn, encrypt=True, master_key=MASTER_KEY)
    quantities = {"Yrs|ann-1": [1, 2], "Yrs|bob-1": [3], "Yrs|bob-2": [4, 5], "Yrs|cy-1": [6]}
    async with open_journal(dsn, settings=settings, subject_of=customer) as j:
        for pid, qs in quantities.items():
            await j.persist(pid, [PlacedV1(pid, q, "secret note") for q in qs])
        assert await j.forget("YrsCust|ann")
    return settings, quantities


async def test_encrypted_rows_are_decoded_upcast_and_a_forgotten_subjects_flagged(
    journal: Journal, spark: Any, source: Any, dsn: str
) -> None:
    """Before: every row had a null event and event_type 'e|1|...', silently."""
    from journal import open_journal
    from projections.spark.payloads import PayloadReader
    from tests.hooks_app import UPCASTERS, customer, registry

    settings, quantities = await _customer_journal(dsn)
    serializers = registry()
    serializers.upcasters.include(UPCASTERS)
    async with open_journal(dsn, settings=settings, serializers=serializers, subject_of=customer) as j:
        reader = PayloadReader.of(j, source)
    raw = read_journal(spark, source, "Yrs", partitions=4)
    rows = {(r.persistence_id, r.seq_nr): r for r in decode_events(raw, payloads=reader).collect()}
    assert set(rows) == {(pid, i + 1) for pid, qs in quantities.items() for i in range(len(qs))}
    for (pid, seq), r in rows.items():
        if pid.startswith("Yrs|ann"):  # forgotten: its type, no event
            assert (r.forgotten, r.event, r.event_type) == (True, None, "tests.hooks_app:PlacedV1")
        else:  # decrypted and upcast: quantity became items
            assert (r.forgotten, r.event_type, r.part) == (False, "shop:Placed#2", 0)
            assert (r.event.customer, r.event.items, r.event.note) == (pid, quantities[pid][seq - 1], "secret note")
    with pytest.raises(Exception, match="sealed payload"):  # without the codec: refused, not null
        decode_events(raw).collect()


def _items_job(events: Any) -> Any:
    from pyspark.sql import functions as F

    from projections.spark.backfill import ReadModel

    frame = (
        events.where(~F.col("forgotten"))
        .groupBy("persistence_id")
        .agg(F.sum("event.items").cast("long").alias("total"), F.count("*").alias("n"))
    )
    return ReadModel(frame=frame, table="items_bf", key=["persistence_id"])


async def test_backfill_of_an_encrypted_upcast_journal_equals_the_online_projection(
    journal: Journal, spark: Any, source: Any, dsn: str
) -> None:
    from journal import Forgotten, open_journal
    from projections import Worker
    from projections.spark.backfill import backfill
    from projections.spark.payloads import PayloadReader
    from tests.hooks_app import UPCASTERS, customer, registry

    settings, _ = await _customer_journal(dsn)
    serializers = registry()
    serializers.upcasters.include(UPCASTERS)

    async def online(conn: Any, envelopes: Any) -> None:  # the online twin of _items_job
        await conn.execute(TOTALS_DDL.format(t="items_online"))
        for env in envelopes:
            if type(env.event) is Forgotten:
                continue
            await conn.execute(
                "INSERT INTO items_online VALUES ($1, $2, 1) ON CONFLICT (persistence_id) DO UPDATE "
                "SET total = items_online.total + EXCLUDED.total, n = items_online.n + 1",
                env.persistence_id, env.event.items,
            )  # fmt: skip

    async with open_journal(dsn, settings=settings, serializers=serializers, subject_of=customer) as j:
        res = await backfill(
            spark, j, source, "items", "Yrs", _items_job, partitions=4, payloads=PayloadReader.of(j, source)
        )
        assert res.events == 6
        worker = Worker(j, j.settings, "items-online", "Yrs", online, "grouped")
        task = asyncio.create_task(worker.run())
        try:
            await wait_until(lambda: _table_has(dsn, "items_online", 3), 60, "the online projection")
        finally:
            worker.stop()
            await task
    backfilled = await _table(dsn, "SELECT persistence_id, total, n FROM items_bf ORDER BY 1")
    assert backfilled == await _table(dsn, "SELECT persistence_id, total, n FROM items_online ORDER BY 1")
    assert backfilled == [("Yrs|bob-1", 3, 1), ("Yrs|bob-2", 9, 2), ("Yrs|cy-1", 6, 1)]


async def _table_has(dsn: str, table: str, n: int) -> bool:
    try:
        return len(await _table(dsn, f"SELECT 1 FROM {table}")) >= n
    except asyncpg.UndefinedTableError:
        return False


def test_cli_export_of_an_encrypted_journal_decodes_or_refuses_in_one_line(
    dsn: str, spark: Any, tmp_path: Path
) -> None:
    """``projections spark-export`` (a subprocess) with the codec's settings and the hooks exports
    decrypted, upcast events and flags the forgotten ones; without the codec's settings it
    refuses in one line (exit 2) before Spark starts. Before: exit 0, every event null."""
    import asyncio
    import subprocess
    import sys

    from conftest import truncate_all

    asyncio.run(truncate_all(dsn))
    asyncio.run(_customer_journal(dsn))
    base = [sys.executable, "-m", "projections", "spark-export", "--entity-type", "Yrs", "--dsn", dsn,
            "--master", "local[2]", "--partitions", "2"]  # fmt: skip
    hooks = ["--subject-of", "tests.hooks_app:customer", "--upcasters", "tests.hooks_app:UPCASTERS",
             "--serializers", "tests.hooks_app:registry"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOURNAL_")}
    refused = subprocess.run(
        [*base, "--out", str(tmp_path / "no")], capture_output=True, text=True, env=env, timeout=300
    )
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "error: the journal holds encrypted events: read them with codec.encrypt on (JOURNAL_CODEC_ENCRYPT=1, and "
        "JOURNAL_CODEC_MASTER_KEY if it was set when they were written), or export them as stored (--raw)"
    ]
    env |= {"JOURNAL_CODEC_ENCRYPT": "1", "JOURNAL_CODEC_MASTER_KEY": MASTER_KEY}
    done = subprocess.run(
        [*base, *hooks, "--out", str(tmp_path / "e")], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    rows = {(r.persistence_id, r.seq_nr): r for r in spark.read.parquet(str(tmp_path / "e")).collect()}
    assert len(rows) == 6
    assert {k for k, r in rows.items() if r.forgotten} == {("Yrs|ann-1", 1), ("Yrs|ann-1", 2)}
    assert all(r.event is None for r in rows.values() if r.forgotten)
    wrong = ["--upcasters", "tests.hooks_app:UPCASTERS", "--serializers", "tests.hooks_app:registry"]
    no_subjects = subprocess.run(
        [*base, *wrong, "--out", str(tmp_path / "w")], capture_output=True, text=True, env=env, timeout=300
    )  # without --subject-of the pids are the subjects: none has a key
    assert no_subjects.returncode == 1
    assert (
        no_subjects.stderr.strip()
        .splitlines()[-1]
        .startswith("error: a Spark worker failed: journal.errors.SerializationError: no key of 'Yrs|")
    ), no_subjects.stderr[-2000:]
    assert {(k, r.event_type, r.event.items) for k, r in rows.items() if not r.forgotten} == {
        (("Yrs|bob-1", 1), "shop:Placed#2", 3), (("Yrs|bob-2", 1), "shop:Placed#2", 4),
        (("Yrs|bob-2", 2), "shop:Placed#2", 5), (("Yrs|cy-1", 1), "shop:Placed#2", 6),
    }  # fmt: skip
