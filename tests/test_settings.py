from __future__ import annotations

import pytest

from journal import ConfigurationError, JournalSettings


def test_defaults_match_the_reference() -> None:
    s = JournalSettings.load(env={})
    assert s.query.buffer_size == 1000
    assert s.query.refresh_interval == 3.0
    assert s.query.behind_current_time == 0.1
    assert s.query.backtracking_window == 120.0
    assert s.query.backtracking_behind_current_time == 10.0
    assert s.query.mode == "horizon"
    assert s.schema == "public"
    assert s.connection.dsn is None


def test_env_then_keywords() -> None:
    env = {"JOURNAL_SCHEMA": "events", "JOURNAL_QUERY_BUFFER_SIZE": "50", "JOURNAL_NOTIFY": "false"}
    s = JournalSettings.load(env=env)
    assert (s.schema, s.query.buffer_size, s.write.notify) == ("events", 50, False)
    s = JournalSettings.load(env=env, buffer_size=7, **{"query.mode": "backtracking"})
    assert (s.query.buffer_size, s.query.mode) == (7, "backtracking")


@pytest.mark.parametrize(
    ("kwargs", "env", "match"),
    [
        ({"schema": "bad-name"}, {}, "not a valid identifier"),
        ({"schema": "x; drop table y"}, {}, "not a valid identifier"),
        ({"buffer_size": 0}, {}, "buffer_size must be > 0"),
        ({"mode": "sometimes"}, {}, "query mode"),
        ({"no_such_setting": 1}, {}, "unknown setting"),
        ({}, {"JOURNAL_QUERY_BUFFER_SIZE": "many"}, "not a valid int"),
        ({"pool_min_size": 5, "pool_max_size": 2}, {}, "pool_min_size"),
    ],
)
def test_bad_settings(kwargs: dict[str, object], env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        JournalSettings.load(env=env, **kwargs)


def test_cassandra_defaults_and_validation() -> None:
    c = JournalSettings.load(env={}).cassandra
    assert (c.target_partition_size, c.read_consistency, c.write_consistency) == (500_000, "QUORUM", "QUORUM")
    assert (c.serial_consistency, c.single_writer_check, c.username, c.local_datacenter) == ("SERIAL", True, None, None)
    env = {"JOURNAL_CASSANDRA_USERNAME": "u", "JOURNAL_CASSANDRA_PASSWORD": "p", "JOURNAL_SINGLE_WRITER_CHECK": "off"}
    c = JournalSettings.load(env=env, read_consistency="LOCAL_QUORUM", target_partition_size=5).cassandra
    assert (c.username, c.password, c.single_writer_check, c.read_consistency) == ("u", "p", False, "LOCAL_QUORUM")
    assert "password" not in repr(c)
    for bad, match in [
        ({"write_consistency": "MOST"}, "write_consistency must be one of"),
        ({"serial_consistency": "QUORUM"}, "serial_consistency must be one of"),
        ({"target_partition_size": 0}, "target_partition_size must be > 0"),
        ({"username": "u"}, "username and password must be set together"),
        ({"max_message_batch_bytes": 0}, "max_message_batch_bytes must be > 0"),
    ]:
        with pytest.raises(ConfigurationError, match=match):
            JournalSettings.load(env={}, **bad)


def test_a_misspelled_environment_variable_is_named_with_the_setting_it_likely_meant(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {
        "JOURNAL_WRITE_FREEZ_HEAP": "false",  # a typo: ignored, but said
        "JOURNAL_WRITE_FREEZE_HEAP": "false",
        "JOURNAL_DSN": "postgresql://h/db",
        "JOURNAL_TEST_DSN": "postgresql://t/db",  # the test suite's, not a setting's
        "JOURNAL_ORDERS_TOPIC": "x",  # an application's own: no guess
    }
    with caplog.at_level("WARNING", logger="journal.settings"):
        s = JournalSettings.load(env=env)
        JournalSettings.load(env=env)  # once per process
    assert s.write.freeze_heap is False
    assert [r.getMessage() for r in caplog.records] == [
        "environment variable JOURNAL_WRITE_FREEZ_HEAP names no setting and is ignored "
        "(did you mean JOURNAL_WRITE_FREEZE_HEAP?)",
        "environment variable JOURNAL_ORDERS_TOPIC names no setting and is ignored",
    ]
