"""Spark on a real standalone cluster (a master and two workers from pyspark's launcher, on
127.0.0.1): ``projections spark-export`` and ``spark-backfill`` with ``--master spark://...``
give what the local run gives, against the embedded PostgreSQL (reached through the bridge)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from journal import JournalSettings, SparkSetupError, open_journal

pyspark = pytest.importorskip("pyspark", reason="the 'spark' extra is not installed")

from projections.spark.cluster import LocalSparkCluster  # noqa: E402
from projections.spark.environment import find_jdbc_driver, spark_session  # noqa: E402

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[1]

JOB = '''
def job(events):
    """A read model through a Python UDF: the executors must run this interpreter."""
    from pyspark.sql import functions as F

    from projections.spark import ReadModel

    double = F.udf(lambda x: None if x is None else int(x) * 2, "long")
    frame = events.groupBy("persistence_id").agg(
        F.sum(double("event.amount")).cast("long").alias("doubled"), F.count("*").alias("n")
    )
    return ReadModel(frame=frame, table="cluster_totals", key=["persistence_id"])
'''


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalSparkCluster]:
    """A master and two 1-core workers on free loopback ports, stopped whatever happens."""
    c = LocalSparkCluster(workers=2, worker_cores=1, worker_memory="768m")
    try:
        find_jdbc_driver(JournalSettings.load(env={}).spark)
        c.start()
    except SparkSetupError as e:
        if os.environ.get("CI"):  # .ci/run installs Java: there, a cluster that cannot start is a failure
            raise
        pytest.skip(f"a Spark cluster cannot start here: {e}")
    try:
        yield c
    finally:
        c.stop()


def _cli(tmp_path: Path, *args: str) -> str:
    """``projections ARGS`` in a fresh process (its own Spark driver), small memory."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
        "PYSPARK_PYTHON": sys.executable,
        "JOURNAL_SPARK_DRIVER_MEMORY": "512m",
        "JOURNAL_SPARK_EXECUTOR_MEMORY": "512m",
        "JOURNAL_SPARK_SHUFFLE_PARTITIONS": "4",
    }
    done = subprocess.run(
        [sys.executable, "-m", "projections", *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


async def _seed(dsn: str) -> None:
    from conftest import truncate_all

    await truncate_all(dsn)
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
        for i in range(40):
            await j.persist(f"acct|{i}", [{"amount": i, "currency": "EUR"}, {"amount": 1, "currency": "SEK"}])
        await j.persist("other|x", [{"amount": 1000}])


async def _rows(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(dsn)
    try:
        return [tuple(r) for r in await conn.fetch(sql)]
    finally:
        await conn.close()


def _parquet_rows(path: Path) -> list[tuple[Any, ...]]:
    spark = spark_session(JournalSettings.load(env={}, master="local[1]", shuffle_partitions=2).spark)
    df = spark.read.parquet(str(path))
    cols = sorted(df.columns)
    return sorted(tuple(str(r[c]) for c in cols) for r in df.select(*cols).collect())


def test_export_and_backfill_on_a_cluster_equal_the_local_run(
    cluster: LocalSparkCluster, dsn: str, tmp_path: Path
) -> None:
    asyncio.run(_seed(dsn))
    (tmp_path / "cluster_jobs.py").write_text(JOB, encoding="utf-8")
    common = ["--entity-type", "acct", "--dsn", dsn, "--partitions", "4"]
    apps_before = len(cluster.status()["completedapps"])

    out = _cli(tmp_path, "spark-export", *common, "--out", str(tmp_path / "local"), "--master", "local[2]")
    assert "exported 80 events of acct in 4 partitions" in out
    out = _cli(tmp_path, "spark-export", *common, "--out", str(tmp_path / "cluster"), "--master", cluster.master_url)
    assert "exported 80 events of acct in 4 partitions" in out
    local_dirs = sorted(p.name for p in (tmp_path / "local").iterdir() if p.is_dir())
    assert local_dirs == sorted(p.name for p in (tmp_path / "cluster").iterdir() if p.is_dir())
    exported = _parquet_rows(tmp_path / "local")
    assert len(exported) == 80
    assert _parquet_rows(tmp_path / "cluster") == exported

    table = "SELECT persistence_id, doubled, n FROM cluster_totals ORDER BY persistence_id"
    out = _cli(tmp_path, "spark-backfill", "local_bf", *common, "--job", "cluster_jobs:job", "--master", "local[2]")
    assert "80 events read in 4 partitions, 40 rows written to cluster_totals" in out
    local_rows = asyncio.run(_rows(dsn, table))
    assert local_rows[:2] == [("acct|0", 2, 2), ("acct|1", 4, 2)] and len(local_rows) == 40
    asyncio.run(_rows(dsn, "DROP TABLE cluster_totals"))
    out = _cli(
        tmp_path, "spark-backfill", "cluster_bf", *common, "--job", "cluster_jobs:job", "--master", cluster.master_url
    )
    assert "80 events read in 4 partitions, 40 rows written to cluster_totals" in out
    assert asyncio.run(_rows(dsn, table)) == local_rows
    offsets = "SELECT projection_name, count(*) FROM projection_timestamp_offset_store GROUP BY 1 ORDER BY 1"
    assert asyncio.run(_rows(dsn, offsets)) == [("cluster_bf", 1024), ("local_bf", 1024)]

    # the two cluster runs ran on the cluster's executors, on both workers
    status = cluster.status()
    apps = status["completedapps"][apps_before:]
    assert len(apps) == 2 and all(a["name"] == "slice-journal" for a in apps)
    assert status["aliveworkers"] == 2
    work = [d for d in Path(str(cluster.base_dir)).glob("work-*/app-*/*") if d.is_dir()]
    assert {d.parents[1].name for d in work} == {"work-0", "work-1"}


def test_cluster_on_loopback_is_bridged_and_runs_this_python() -> None:
    from projections.spark.environment import JdbcDriver, is_cluster_on_this_host, runs_on_this_host, session_conf
    from projections.spark.jdbc import jdbc_source

    for master in ("spark://127.0.0.1:7077", "spark://localhost:7077", "spark://127.0.0.2:1,127.0.0.3:2"):
        assert is_cluster_on_this_host(master) and runs_on_this_host(master)
    for master in ("spark://10.0.0.5:7077", "spark://127.0.0.1:7077,spark-2:7077", "local[2]", "yarn"):
        assert not is_cluster_on_this_host(master)
    assert runs_on_this_host("local[*]") and not runs_on_this_host("spark://db.example:7077")
    settings = JournalSettings.load(env={}, executor_memory="384m").spark
    conf = session_conf(settings, JdbcDriver(jar=Path("/x/pg.jar")), "spark://127.0.0.1:7077")
    assert conf["spark.executor.memory"] == "384m" and conf["spark.driver.host"] == "127.0.0.1"
    assert conf["spark.pyspark.python"] in (os.environ.get("PYSPARK_PYTHON"), sys.executable)
    remote = session_conf(settings, JdbcDriver(jar=Path("/x/pg.jar")), "spark://10.0.0.5:7077")
    assert "spark.driver.host" not in remote and remote["spark.executor.memory"] == "384m"
    assert "spark.executor.memory" not in session_conf(settings, JdbcDriver(jar=Path("/x/pg.jar")), "local[2]")
    src = jdbc_source("postgresql://postgres:@/postgres?host=/tmp/sj-nowhere", local=True)
    assert src.url.startswith("jdbc:postgresql://127.0.0.1:")


def test_jdbc_driver_resolved_with_maven_into_the_cache(tmp_path: Path) -> None:
    import shutil
    import zipfile

    from projections.spark.environment import maven_jar

    if shutil.which("mvn") is None:
        if os.environ.get("CI"):
            raise AssertionError("CI machines have Maven")
        pytest.skip("no mvn on PATH")
    package = JournalSettings.load(env={}).spark.jdbc_package
    jar = maven_jar(package, tmp_path / "cache")
    assert jar is not None and jar.parent == tmp_path / "cache" and jar.name.startswith("postgresql-")
    assert "org/postgresql/Driver.class" in zipfile.ZipFile(jar).namelist()
    # cached: found again without running Maven
    assert maven_jar(package, tmp_path / "cache", mvn=str(tmp_path / "no-mvn")) == jar
    settings = JournalSettings.load(env={}).spark
    found = find_jdbc_driver(settings, candidates=[str(tmp_path / "none.jar")], cache_dir=tmp_path / "cache")
    assert found.jar == jar
    # an artifact Maven cannot resolve: None (logged), nothing left in the cache
    assert maven_jar("org.postgresql:postgresql:0.0.0-nope", tmp_path / "c2") is None
    assert [p.name for p in (tmp_path / "c2").iterdir()] == []
    with pytest.raises(SparkSetupError, match="group:artifact:version"):
        maven_jar("postgresql", tmp_path / "c3")


def _processes_in(directory: Path) -> list[int]:
    """Pids of this machine's processes whose working directory is ``directory``."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cwd").resolve() == directory.resolve():
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours to look at
            continue
    return pids


def test_a_worker_that_cannot_start_is_reported_and_nothing_is_left_running(tmp_path: Path) -> None:
    c = LocalSparkCluster(workers=1, worker_memory="lots", base_dir=tmp_path)  # not a size: the worker exits
    try:
        c.start(timeout=180)
    except SparkSetupError as e:
        if "Java" in str(e) and "was found" in str(e):
            pytest.skip(str(e))
        assert "worker exited" in str(e) and "worker-0.log" in str(e)
    else:
        c.stop()
        pytest.fail("a worker with --memory lots started")
    assert (tmp_path / "master.log").is_file()  # the master was up, and is stopped again
    assert _processes_in(tmp_path) == []
