"""Cassandra backend parts that need no server: CQL vs the reference schema, partition math,
DSN parsing, the CLI output. (No Cassandra mocks: the suites on a real Cassandra are
test_journal_contract.py, test_tag_store_contract.py, test_tags_backends.py, test_entities.py,
test_cassandra_faults.py and test_cassandra_local.py.)"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from journal.cassandra.connections import parse_target
from journal.cassandra.cql import schema_statements, statements
from journal.cassandra.partitions import PartitionLayout
from journal.cli import app
from journal.errors import ConfigurationError

REFERENCE_KEYS = {
    "messages": "PRIMARY KEY ((persistence_id, partition_nr), sequence_nr, timestamp)",
    "tag_views": "PRIMARY KEY ((tag_name, timebucket), timestamp, persistence_id, tag_pid_sequence_nr)",
    "tag_write_progress": "PRIMARY KEY (persistence_id, tag)",
    "tag_scanning": "PRIMARY KEY (persistence_id)",
    "snapshots": "PRIMARY KEY (persistence_id, sequence_nr)",
}
REFERENCE_COLUMNS = {
    "messages": "persistence_id text, partition_nr bigint, sequence_nr bigint, timestamp timeuuid, timebucket text, "
    "writer_uuid text, ser_id int, ser_manifest text, event_manifest text, event blob, meta_ser_id int, "
    "meta_ser_manifest text, meta blob, tags set<text>",
    "tag_views": "tag_name text, persistence_id text, sequence_nr bigint, timebucket bigint, timestamp timeuuid, "
    "tag_pid_sequence_nr bigint, writer_uuid text, ser_id int, ser_manifest text, event_manifest text, event blob, "
    "meta_ser_id int, meta_ser_manifest text, meta blob",
    "tag_write_progress": (
        "persistence_id text, tag text, sequence_nr bigint, tag_pid_sequence_nr bigint, offset timeuuid"
    ),
    "metadata": "persistence_id text PRIMARY KEY, deleted_to bigint, properties map<text, text>",
    "all_persistence_ids": "persistence_id text PRIMARY KEY",
}


def _table(stmts: list[str], name: str) -> str:
    return " ".join(next(s for s in stmts if re.search(rf"\.{name} \(", s)).split())


def test_schema_matches_the_reference_tables() -> None:
    stmts = schema_statements("ks")
    assert stmts[0].startswith("CREATE KEYSPACE IF NOT EXISTS ks")
    for table, key in REFERENCE_KEYS.items():
        assert key in _table(stmts, table)
    for table, cols in REFERENCE_COLUMNS.items():
        assert cols in _table(stmts, table), table
    assert "CLUSTERING ORDER BY (sequence_nr DESC)" in _table(stmts, "snapshots")


def test_statements_use_the_keyspace_and_bind_markers_only() -> None:
    cql = statements("ks")
    assert {"insert_message", "read_tag_views", "insert_tag_view", "write_progress", "read_scanning"} <= set(cql)
    for name, text in cql.items():
        assert "{keyspace}" not in text and " ks." in text, name
        assert "'" not in text.replace("''", ""), name  # values are bind markers
    assert "timestamp > ? AND timestamp < ?" in cql["read_tag_views"]
    assert "ORDER BY timestamp ASC" in cql["read_tag_views"]


def test_bad_keyspace_refused() -> None:
    with pytest.raises(ConfigurationError):
        statements("ks; DROP")
    with pytest.raises(ConfigurationError):
        parse_target("cassandra://h/bad-name")


def test_parse_target() -> None:
    assert parse_target("cassandra://h1,h2/journal") == (["h1", "h2"], 9042, "journal")
    assert parse_target("cassandra://h1:9142/ks") == (["h1"], 9142, "ks")
    with pytest.raises(ConfigurationError):
        parse_target("postgresql://h/ks")


@given(st.integers(1, 10**12), st.integers(1, 10**6))
def test_partition_math(seq: int, size: int) -> None:
    lay = PartitionLayout(size)
    p = lay.partition_nr(seq)
    assert p * size < seq <= (p + 1) * size
    assert lay.write_partition(seq) == p + 1


def test_default_partition_size() -> None:
    lay = PartitionLayout(500_000)
    assert [lay.partition_nr(s) for s in (1, 500_000, 500_001, 1_000_001)] == [0, 0, 1, 2]


def test_cli_prints_the_schema() -> None:
    out = CliRunner().invoke(app, ["cassandra-schema", "--keyspace", "demo"])
    assert out.exit_code == 0, out.output
    assert "CREATE TABLE IF NOT EXISTS demo.tag_views" in out.output


def test_timeuuid_bounds_are_cassandras_minimum() -> None:
    """Cassandra compares clock-sequence and node bytes signed: 0x80.. is the least, as the driver's
    min_uuid_from_time makes it; a bound with 0x00 bytes would cut rows at the bucket's first tick."""
    util = pytest.importorskip("cassandra.util")
    from journal.cassandra.tag_store import lower_bound, upper_bound
    from journal.timeuuid import GREGORIAN_OFFSET

    ms = 1_700_000_000_000
    assert lower_bound(ms) == util.min_uuid_from_time(ms / 1000)
    assert upper_bound(ms * 10_000 + GREGORIAN_OFFSET) == util.min_uuid_from_time(ms / 1000)
