"""Alembic: head matches the MetaData, up/down/offline work, the version table has its own name."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from journal.postgres.dsn import sqlalchemy_url
from journal.postgres.migrations import downgrade, head_revision, offline_sql, upgrade
from journal.postgres.schema import VERSION_TABLE, metadata
from tests.support.scratch import scratch_database

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def empty_db(server_dsn: str) -> Iterator[str]:
    with scratch_database(server_dsn, "sjmig") as db:
        yield db


def _diff(dsn: str, schema: str) -> list[object]:
    engine = create_engine(sqlalchemy_url(dsn), connect_args={"options": f"-csearch_path={schema}"})
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True, "version_table": VERSION_TABLE}
            )
            return list(compare_metadata(ctx, metadata))
    finally:
        engine.dispose()


def _tables(dsn: str, schema: str) -> set[str]:
    engine = create_engine(sqlalchemy_url(dsn))
    try:
        return set(inspect(engine).get_table_names(schema=schema))
    finally:
        engine.dispose()


@pytest.mark.parametrize("schema", ["public", "journal_events"])
def test_head_matches_metadata_and_downgrade_works(empty_db: str, schema: str) -> None:
    upgrade(empty_db, schema)
    assert _diff(empty_db, schema) == []
    tables = _tables(empty_db, schema)
    assert {"event_journal", "snapshot", VERSION_TABLE} <= tables
    assert "alembic_version" not in tables  # an application's own Alembic table stays untouched
    downgrade(empty_db, schema, "base")
    assert _tables(empty_db, schema) == {VERSION_TABLE}
    upgrade(empty_db, schema)  # and up again
    assert _diff(empty_db, schema) == []


def test_slice_index_matches_the_reference(empty_db: str) -> None:
    upgrade(empty_db)
    engine = create_engine(sqlalchemy_url(empty_db))
    try:
        idx = {i["name"]: i["column_names"] for i in inspect(engine).get_indexes("event_journal")}
        pk = inspect(engine).get_pk_constraint("event_journal")["constrained_columns"]
    finally:
        engine.dispose()
    assert idx["event_journal_slice_idx"] == ["slice", "entity_type", "db_timestamp", "seq_nr"]
    assert pk == ["persistence_id", "seq_nr"]


def test_offline_sql_for_a_dba() -> None:
    sql = offline_sql("journal_events")
    assert 'CREATE SCHEMA IF NOT EXISTS "journal_events"' in sql
    assert "CREATE TABLE event_journal" in sql
    assert "CREATE INDEX event_journal_slice_idx" in sql
    assert VERSION_TABLE in sql


def test_alembic_cli_from_the_repository_root(empty_db: str) -> None:
    env = {**os.environ, "JOURNAL_DSN": empty_db}
    alembic = [sys.executable, "-m", "alembic"]
    subprocess.run([*alembic, "upgrade", "head"], cwd=ROOT, env=env, check=True, capture_output=True)
    out = subprocess.run([*alembic, "current"], cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    assert head_revision() in out.stdout
    out = subprocess.run(
        [*alembic, "-x", f"dsn={empty_db}", "upgrade", "head", "--sql"],
        cwd=ROOT, env={**os.environ, "JOURNAL_DSN": ""}, check=True, capture_output=True, text=True,
    )  # fmt: skip
    assert "CREATE TABLE event_journal" in out.stdout
    subprocess.run([*alembic, "downgrade", "base"], cwd=ROOT, env=env, check=True, capture_output=True)
    assert "event_journal" not in _tables(empty_db, "public")


def test_journal_migrate_and_info_cli(empty_db: str, tmp_path: Path) -> None:
    journal_cli = [sys.executable, "-c", "from journal.cli import main; main()"]
    out = subprocess.run(
        [*journal_cli, "migrate", "--dsn", empty_db, "--schema", "svc"],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert f"to {head_revision()}" in out.stdout
    out = subprocess.run(
        [*journal_cli, "info", "--dsn", empty_db, "--schema", "svc"],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert f"revision {head_revision()}" in out.stdout and "events:          0" in out.stdout
    bad = subprocess.run([*journal_cli, "info", "--dsn", empty_db, "--schema", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "run `journal migrate`" in bad.stderr
    bad = subprocess.run([*journal_cli, "migrate", "--schema", "bad-name", "--sql"], capture_output=True, text=True)
    assert bad.returncode == 2 and "not a valid identifier" in bad.stderr


def test_durable_state_matches_the_plugin(empty_db: str) -> None:
    """durable_state has the plugin's columns, key (persistence_id, as since its PR #559) and
    slice index (issue 34)."""
    upgrade(empty_db)
    engine = create_engine(sqlalchemy_url(empty_db))
    try:
        insp = inspect(engine)
        cols = {c["name"]: (str(c["type"]), c["nullable"]) for c in insp.get_columns("durable_state")}
        idx = {i["name"]: i["column_names"] for i in insp.get_indexes("durable_state")}
        pk = insp.get_pk_constraint("durable_state")["constrained_columns"]
    finally:
        engine.dispose()
    assert cols == {
        "slice": ("INTEGER", False),
        "entity_type": ("VARCHAR(255)", False),
        "persistence_id": ("VARCHAR(255)", False),
        "revision": ("BIGINT", False),
        "db_timestamp": ("TIMESTAMP", False),
        "state_ser_id": ("INTEGER", False),
        "state_ser_manifest": ("VARCHAR(255)", True),
        "state_payload": ("BYTEA", False),
        "tags": ("ARRAY", True),
    }
    assert pk == ["persistence_id"]
    assert idx["durable_state_slice_idx"] == ["slice", "entity_type", "db_timestamp", "revision"]


def test_durable_state_of_the_plugins_older_ddl_gets_its_new_key(empty_db: str) -> None:
    """A durable_state made by the plugin's 1.1.2 DDL (key (persistence_id, revision)) keeps its
    rows and gets the key persistence_id, as the plugin's own migration does."""
    ddl = (ROOT / "interop" / "jvm" / "ddl" / "akka_persistence_r2dbc_1.1.2.sql").read_text()
    engine = create_engine(sqlalchemy_url(empty_db))
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(ddl)
            conn.exec_driver_sql(
                "INSERT INTO durable_state VALUES (1, 't', 't|a', 3, now(), 1, '', '\\x7b7d'::bytea, NULL)"
            )
        upgrade(empty_db)
        insp = inspect(engine)
        pk = insp.get_pk_constraint("durable_state")["constrained_columns"]
        with engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT persistence_id, revision FROM durable_state").all()
    finally:
        engine.dispose()
    assert pk == ["persistence_id"]
    assert [tuple(r) for r in rows] == [("t|a", 3)]


def test_management_last_updated_is_akka_projections_bigint(empty_db: str) -> None:
    """projection_management.last_updated holds epoch milliseconds (BIGINT, as in Akka Projection's
    DDL, so a JVM projection's management API writes the shared row): a row written before
    migration 0012 is converted, and back on downgrade. Before: timestamptz."""
    upgrade(empty_db, revision="0011")
    engine = create_engine(sqlalchemy_url(empty_db))
    insert = "INSERT INTO projection_management VALUES ('p', '0-1023', true, '2026-11-27 10:00:00.123+00'::timestamptz)"
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(insert)
        upgrade(empty_db)
        insp = inspect(engine)
        types = {c["name"]: str(c["type"]) for c in insp.get_columns("projection_management")}
        with engine.connect() as conn:
            millis = conn.exec_driver_sql("SELECT last_updated FROM projection_management").scalar_one()
        downgrade(empty_db, revision="0011")
        with engine.connect() as conn:
            back = conn.exec_driver_sql("SELECT last_updated::text FROM projection_management").scalar_one()
    finally:
        engine.dispose()
    assert types["last_updated"] == "BIGINT"
    assert millis == 1_795_773_600_123
    assert back.startswith("2026-11-27 10:00:00.123")
