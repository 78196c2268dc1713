"""The local Cassandra runner (journal.cassandra.local) and ``journal cassandra local start|status|stop``:
its configuration, its state file, its failure report, a real detached node driven through the
CLI, and PasswordAuthenticator on the tests' auth node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cassandra_fixtures import CassandraTarget, skip_or_fail

from journal.cassandra.local import (
    DEFAULT_VERSION,
    LocalCassandra,
    NodeState,
    cassandra_yaml,
    ensure_jars,
    free_port,
    log_tail,
)
from journal.errors import CassandraSetupError, CassandraStartError

JOURNAL = str(Path(sys.executable).with_name("journal"))


def _yaml_lines(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines()}


def test_yaml_is_a_single_node_on_the_given_address_and_ports(tmp_path: Path) -> None:
    lines = _yaml_lines(cassandra_yaml(tmp_path, "127.0.0.7", 19042, 17000, authenticator=False))
    assert {
        "num_tokens: 1", "listen_address: 127.0.0.7", "rpc_address: 127.0.0.7", "native_transport_port: 19042",
        "storage_port: 17000", '- seeds: "127.0.0.7:17000"', "auto_snapshot: false",
        "authenticator: AllowAllAuthenticator", "commitlog_sync: periodic", "start_native_transport: true",
    } <= lines  # fmt: skip
    assert f"- {tmp_path / 'data'}" in lines and f"commitlog_directory: {tmp_path / 'commitlog'}" in lines
    secured = _yaml_lines(cassandra_yaml(tmp_path, "127.0.0.1", 1, 2, authenticator=True, durable=True))
    assert {"authenticator: PasswordAuthenticator", "authorizer: CassandraAuthorizer"} <= secured
    assert "commitlog_sync: batch" in secured


def test_node_state_round_trip(tmp_path: Path) -> None:
    assert NodeState.load(tmp_path) is None
    state = NodeState(pid=os.getpid(), host="127.0.0.1", port=9, storage_port=7, data_dir="/d", log="/d/node.log",
                      version=DEFAULT_VERSION, authenticator=False, throwaway=True)  # fmt: skip
    state.save(tmp_path)
    loaded = NodeState.load(tmp_path)
    assert loaded == state and loaded.contact_point == "127.0.0.1:9" and loaded.alive()
    assert json.loads(NodeState.path(tmp_path).read_text())["port"] == 9


def test_cached_jars_are_reused_without_maven(tmp_path: Path) -> None:
    home = tmp_path / "cassandra-9.9.9"
    (home / "lib").mkdir(parents=True)
    (home / "COMPLETE").write_text("9.9.9")
    assert ensure_jars("9.9.9", tmp_path, progress=lambda _: pytest.fail("must not resolve")) == home / "lib"


def test_free_port_and_log_tail(tmp_path: Path) -> None:
    assert 0 < free_port() < 65536
    log = tmp_path / "node.log"
    log.write_text("\n".join(f"line {i}" for i in range(100)))
    assert log_tail(log, 3) == "line 97\nline 98\nline 99"
    assert log_tail(tmp_path / "missing.log") == "(no log)"


def _jars_or_skip() -> None:
    try:
        ensure_jars()
    except CassandraSetupError as e:
        skip_or_fail(str(e))


@pytest.mark.cassandra
def test_a_node_that_cannot_start_fails_with_its_log_tail(tmp_path: Path) -> None:
    _jars_or_skip()
    node = LocalCassandra(tmp_path / "node", heap="2m", startup_timeout=60)  # the JVM refuses such a heap
    with pytest.raises(CassandraStartError, match=r"exited with code \d+ while starting") as ei:
        node.start()
    assert str(tmp_path / "node" / "node.log") in str(ei.value)
    assert "heap" in str(ei.value).lower()  # the JVM's own complaint, from the log's tail
    assert not node.running()


def _cli(*args: str, state_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [JOURNAL, "cassandra", "local", *args, "--state-dir", str(state_dir)],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip


@pytest.mark.cassandra
def test_cli_start_status_stop_a_detached_node(tmp_path: Path) -> None:
    pytest.importorskip("cassandra")
    _jars_or_skip()
    assert _cli("status", state_dir=tmp_path).returncode == 1
    started = _cli("start", "--heap", "384M", state_dir=tmp_path)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        state = NodeState.load(tmp_path)
        assert state is not None and state.alive() and state.throwaway
        assert f"contact point: {state.contact_point}" in started.stdout
        assert f"CASSANDRA_CONTACT_POINTS={state.contact_point}" in started.stdout
        status = _cli("status", state_dir=tmp_path)
        assert status.returncode == 0 and state.contact_point in status.stdout
        again = _cli("start", state_dir=tmp_path)
        assert again.returncode == 0 and "already running" in again.stdout
        cluster: Any = CassandraTarget((state.host,), state.port).cluster()
        try:
            row = cluster.connect().execute("SELECT release_version FROM system.local").one()
            assert row.release_version == DEFAULT_VERSION
        finally:
            cluster.shutdown()
    finally:
        stopped = _cli("stop", state_dir=tmp_path)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not state.alive() and not Path(state.data_dir).exists()
    assert NodeState.load(tmp_path) is None
    assert _cli("status", state_dir=tmp_path).returncode == 1


@pytest.mark.cassandra
def test_password_authenticator(cassandra_auth_node: CassandraTarget) -> None:
    from cassandra.cluster import NoHostAvailable

    assert cassandra_auth_node.credentials == ("cassandra", "cassandra")
    cluster: Any = cassandra_auth_node.cluster()
    try:
        assert cluster.connect().execute("SELECT release_version FROM system.local").one() is not None
    finally:
        cluster.shutdown()
    anonymous: Any = CassandraTarget(cassandra_auth_node.hosts, cassandra_auth_node.port).cluster()
    try:
        with pytest.raises(NoHostAvailable, match=r"(?i)auth"):
            anonymous.connect()
    finally:
        anonymous.shutdown()


@pytest.mark.cassandra
def test_a_taken_port_is_reported_or_replaced(tmp_path: Path) -> None:
    """A given port that another process holds fails the start, saying so; free ports picked by
    the runner itself are picked again when someone takes them first."""
    import socket

    _jars_or_skip()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        node = LocalCassandra(tmp_path / "a", storage_port=taken, startup_timeout=120)
        with pytest.raises(CassandraStartError, match="in use by another process"):
            node.start()
        assert not node.running()
    picked = LocalCassandra(tmp_path / "b", startup_timeout=120)
    with socket.socket() as squatter:  # someone takes the port the runner picked, before it starts
        squatter.bind(("127.0.0.1", picked.storage_port))
        squatter.listen()
        first = picked.storage_port
        try:
            picked.start()
            assert picked.running() and picked.storage_port != first
            assert picked.release_version() == DEFAULT_VERSION
        finally:
            picked.stop()


def test_without_java_or_maven_cassandra_tests_skip_but_fail_in_ci() -> None:
    """Run one Cassandra test in a pytest subprocess whose PATH has neither java nor mvn."""
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "CASSANDRA_CONTACT_POINTS")}
    env["PATH"] = str(root / "no-such-dir")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
           "tests/test_cassandra_local.py::test_password_authenticator"]  # fmt: skip
    skipped = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert "1 skipped" in skipped.stdout, skipped.stdout[-2000:]
    assert "needs Java 17 (java) and Maven (mvn) on PATH" in skipped.stdout
    failed = subprocess.run(cmd, cwd=root, env={**env, "CI": "1"}, capture_output=True, text=True, timeout=120)
    assert failed.returncode != 0 and "CI must run the Cassandra tests" in failed.stdout, failed.stdout[-2000:]
