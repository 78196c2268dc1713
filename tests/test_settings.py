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
