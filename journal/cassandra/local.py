"""A real single-node Apache Cassandra for development and the tests, started by the project.

Cassandra's binary tarball is not on Maven Central, but ``cassandra-all`` and its runtime
dependencies are: Maven resolves them once into the user's cache directory
(``<user_cache_dir>/slice-journal/cassandra-<version>/lib``); the node then runs as
``java -cp 'lib/*' org.apache.cassandra.service.CassandraDaemon`` with a minimal generated
``cassandra.yaml`` (one token, no auto-snapshot, small memtables, free ports) and its data in a
directory of its own. :class:`LocalCassandra` starts it, waits until CQL answers and stops it;
:class:`NodeState` records a detached node for ``journal cassandra local start|stop|status``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .. import maven_jars
from ..errors import CassandraSetupError, CassandraStartError, ConfigurationError

DEFAULT_VERSION = "5.0.9"
"""The newest ``org.apache.cassandra:cassandra-all`` 5.0.x on Maven Central that runs on Java 17."""

MAIN_CLASS = "org.apache.cassandra.service.CassandraDaemon"

JVM17_FLAGS = (
    # The module flags of Cassandra's conf/jvm17-server.options (facts, not optional: without
    # them Cassandra 5.0 fails on Java 17 reaching into JDK internals).
    "-Djdk.attach.allowAttachSelf=true",
    "--add-exports", "java.base/jdk.internal.misc=ALL-UNNAMED",
    "--add-exports", "java.management.rmi/com.sun.jmx.remote.internal.rmi=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.registry=ALL-UNNAMED",
    "--add-exports", "java.rmi/sun.rmi.server=ALL-UNNAMED",
    "--add-exports", "java.sql/java.sql=ALL-UNNAMED",
    "--add-exports", "java.base/java.lang.ref=ALL-UNNAMED",
    "--add-exports", "jdk.unsupported/sun.misc=ALL-UNNAMED",
    "--add-exports", "jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED",
    "--add-exports", "jdk.attach/sun.tools.attach=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang.module=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.loader=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.ref=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.reflect=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.math=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.module=ALL-UNNAMED",
    "--add-opens", "java.base/jdk.internal.util.jar=ALL-UNNAMED",
    "--add-opens", "jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "--add-opens", "java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens", "java.base/java.io=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang.reflect=ALL-UNNAMED",
    "--add-opens", "jdk.compiler/com.sun.tools.javac=ALL-UNNAMED",
    "--add-opens", "java.base/java.lang=ALL-UNNAMED",
    "--add-opens", "java.base/java.util=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
)  # fmt: skip

FAST_START_FLAGS = (
    # A lone seed node has nobody to wait for.
    "-Dcassandra.skip_wait_for_gossip_to_settle=0",
    "-Dcassandra.ring_delay_ms=100",
    "-Dcassandra.superuser_setup_delay_ms=0",
    "-Dcassandra.load_ring_state=false",
    "-Djava.net.preferIPv4Stack=true",
    "-XX:+UseSerialGC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Xss256k",
)

SUPERUSER = ("cassandra", "cassandra")
"""The default superuser PasswordAuthenticator creates (username, password)."""

Progress = maven_jars.Progress


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cache_root() -> Path:
    """``<user_cache_dir>/slice-journal``: the jars, and the state file of a detached node."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("slice-journal"))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


# -- the jars ------------------------------------------------------------------------------------

JARS = maven_jars.JarSet(
    "cassandra", "a local Cassandra", CassandraSetupError, ("org.apache.cassandra:cassandra-all:{version}",)
)


def ensure_jars(version: str = DEFAULT_VERSION, cache: Path | None = None, progress: Progress = _stderr) -> Path:
    """The ``lib`` directory holding cassandra-all ``version`` and its runtime dependencies."""
    return JARS.ensure(version, cache or cache_root(), progress)


# -- configuration -------------------------------------------------------------------------------


def cassandra_yaml(
    data: Path,
    host: str,
    native_port: int,
    storage_port: int,
    authenticator: bool,
    durable: bool = False,
    cluster_name: str = "slice-journal-local",
) -> str:
    """A minimal single-node ``cassandra.yaml`` (Cassandra 5.0 key names). ``durable``: the
    commit log is synced before a write is acknowledged (``batch``); otherwise Cassandra's default
    ``periodic`` sync every 10 s, with which a crash (SIGKILL) of a lone node loses the writes it
    acknowledged in its last seconds (a cluster with replication factor 3 would keep them)."""
    sync = "commitlog_sync: batch" if durable else "commitlog_sync: periodic\ncommitlog_sync_period: 10000ms"
    auth = "PasswordAuthenticator" if authenticator else "AllowAllAuthenticator"
    authz = "CassandraAuthorizer" if authenticator else "AllowAllAuthorizer"
    return f"""\
cluster_name: {cluster_name}
num_tokens: 1
initial_token: 0
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
authenticator: {auth}
authorizer: {authz}
role_manager: CassandraRoleManager
listen_address: {host}
rpc_address: {host}
storage_port: {storage_port}
native_transport_port: {native_port}
start_native_transport: true
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{host}:{storage_port}"
data_file_directories:
  - {data / "data"}
commitlog_directory: {data / "commitlog"}
saved_caches_directory: {data / "saved_caches"}
hints_directory: {data / "hints"}
cdc_raw_directory: {data / "cdc_raw"}
{sync}
auto_snapshot: false
snapshot_before_compaction: false
memtable_heap_space: 64MiB
memtable_offheap_space: 64MiB
concurrent_reads: 8
concurrent_writes: 8
concurrent_counter_writes: 8
concurrent_compactors: 1
key_cache_size: 8MiB
dynamic_snitch: false
hinted_handoff_enabled: false
"""


_LOGBACK = """<configuration scan="false">
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%-5level [%thread] %date{ISO8601} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="STDOUT"/></root>
  <logger name="org.apache.cassandra" level="INFO"/>
</configuration>
"""


# -- the node ------------------------------------------------------------------------------------


class _PortTaken(CassandraStartError):
    """Another process took a port of this node."""


@dataclasses.dataclass
class NodeState:
    """What ``journal cassandra local start`` records about a detached node."""

    pid: int
    host: str
    port: int
    storage_port: int
    data_dir: str
    log: str
    version: str
    authenticator: bool
    throwaway: bool

    @staticmethod
    def path(cache: Path | None = None) -> Path:
        return (cache or cache_root()) / "cassandra-local.json"

    def save(self, cache: Path | None = None) -> None:
        p = self.path(cache)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(dataclasses.asdict(self), indent=2), encoding="utf-8")

    @classmethod
    def load(cls, cache: Path | None = None) -> NodeState | None:
        p = cls.path(cache)
        if not p.exists():
            return None
        try:
            return cls(**json.loads(p.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError) as e:  # not JSON, not an object, keys missing or unknown
            raise ConfigurationError(
                f"the local Cassandra state file {p} is unreadable ({e}): if no node of it runs any more, delete it"
            ) from e

    @property
    def contact_point(self) -> str:
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return _pid_alive(self.pid)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as dead
    with contextlib.suppress(ChildProcessError, OSError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class LocalCassandra:
    """One Cassandra node on ``host`` with free ports (or the given ones); data under ``data_dir``
    (a fresh temporary directory, removed on :meth:`stop`, when None).

    Use as a context manager, or :meth:`start` / :meth:`stop`. With ``authenticator=True`` the node
    runs PasswordAuthenticator and the superuser is :data:`SUPERUSER`; with ``durable=True`` it
    syncs its commit log before acknowledging a write (see :func:`cassandra_yaml`).
    """

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        storage_port: int | None = None,
        heap: str = "512M",
        authenticator: bool = False,
        durable: bool = False,
        version: str = DEFAULT_VERSION,
        cache: Path | None = None,
        startup_timeout: float = 240.0,
        progress: Progress = _stderr,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.storage_port = storage_port or free_port(host)
        self.heap = heap
        self.authenticator = authenticator
        self.durable = durable
        self.version = version
        self.cache = cache
        self.startup_timeout = startup_timeout
        self.progress = progress
        self._auto_ports = port is None and storage_port is None
        self.throwaway = data_dir is None
        fresh = data_dir is None
        self.data_dir = Path(tempfile.mkdtemp(prefix="sj-cassandra-")) if fresh else Path(data_dir or "").resolve()
        self.process: subprocess.Popen[bytes] | None = None
        name_file = self.data_dir / "cluster_name"  # kept with the data: a restart must reuse it
        if name_file.exists():
            self.cluster_name = name_file.read_text(encoding="utf-8").strip()
        else:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.cluster_name = f"slice-journal-{uuid.uuid4().hex[:12]}"
            name_file.write_text(self.cluster_name, encoding="utf-8")

    @property
    def contact_point(self) -> str:
        """``host:port``, the form ``CASSANDRA_CONTACT_POINTS`` and ``cassandra://`` take."""
        return f"{self.host}:{self.port}"

    @property
    def credentials(self) -> tuple[str, str] | None:
        return SUPERUSER if self.authenticator else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "node.log"

    def command(self, lib: Path) -> list[str]:
        java, _ = JARS.require_tools()
        conf = self.data_dir / "conf"
        return [
            java, f"-Xms{self.heap}", f"-Xmx{self.heap}", *JVM17_FLAGS, *FAST_START_FLAGS,
            f"-Dcassandra.config=file://{conf / 'cassandra.yaml'}",
            f"-Dlogback.configurationFile=file://{conf / 'logback.xml'}",
            f"-Dcassandra.logdir={self.data_dir / 'logs'}",
            f"-Dcassandra.storagedir={self.data_dir}",
            "-Dcassandra-foreground=yes",
            "-cp", f"{conf}{os.pathsep}{lib}/*", MAIN_CLASS,
        ]  # fmt: skip

    def start(self, *, detach: bool = False) -> LocalCassandra:
        """Start the node and wait until CQL answers (:class:`CassandraStartError` with the
        log's tail otherwise). ``detach``: the node outlives this process (the CLI).

        Free ports are picked just before the start, so another process may take one first: the
        node then fails to bind (or another node answers on its port, told apart by its unique
        cluster name) and, when the ports were not given, it starts again on new ones."""
        lib = ensure_jars(self.version, self.cache, self.progress)
        for attempt in range(1, 4):
            self._launch(lib, detach)
            try:
                self.wait_until_ready()
                return self
            except _PortTaken:
                self.stop(keep_data=True)
                if not self._auto_ports or attempt == 3:
                    self.stop()
                    raise
                self.port, self.storage_port = free_port(self.host), free_port(self.host)
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _launch(self, lib: Path, detach: bool) -> None:
        conf = self.data_dir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        yaml = cassandra_yaml(
            self.data_dir, self.host, self.port, self.storage_port, self.authenticator, self.durable, self.cluster_name
        )
        (conf / "cassandra.yaml").write_text(yaml, encoding="utf-8")
        (conf / "logback.xml").write_text(_LOGBACK, encoding="utf-8")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.command(lib), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.data_dir, start_new_session=detach,
            )  # fmt: skip

    def wait_until_ready(self) -> str:
        """Poll until ``SELECT release_version FROM system.local`` answers; return the version."""
        deadline = time.monotonic() + self.startup_timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                tail = log_tail(self.log_path)
                taken = "Address already in use" in tail or "is in use by another process" in tail
                error = _PortTaken if taken else CassandraStartError
                raise error(
                    f"Cassandra exited with code {self.process.returncode} while starting; {self.log_path}:\n{tail}"
                )
            if _port_open(self.host, self.port):
                try:
                    version, cluster_name = self._system_local()
                except Exception as e:  # not ready yet (auth setup, schema agreement)
                    last = e
                else:
                    if cluster_name != self.cluster_name:
                        raise _PortTaken(f"another Cassandra ({cluster_name}) answers on {self.contact_point}")
                    return version
            time.sleep(0.5)
        raise CassandraStartError(
            f"Cassandra did not answer CQL on {self.contact_point} within {self.startup_timeout:.0f} s"
            f" (last error: {last}); {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def release_version(self) -> str:
        """Connect with the driver and read ``release_version`` from ``system.local``."""
        return self._system_local()[0]

    def _system_local(self) -> tuple[str, str]:
        with self.session() as session:
            row = session.execute("SELECT release_version, cluster_name FROM system.local").one()
            return str(row.release_version), str(row.cluster_name)

    @contextlib.contextmanager
    def session(self) -> Iterator[Any]:
        """A driver session on this node (superuser credentials when authentication is on)."""
        from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
        from cassandra.policies import RoundRobinPolicy

        profile = ExecutionProfile(load_balancing_policy=RoundRobinPolicy(), request_timeout=60)
        cluster = Cluster(
            [self.host], port=self.port, auth_provider=self.auth_provider(), connect_timeout=5, protocol_version=5,
            execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        )  # fmt: skip
        try:
            yield cluster.connect()
        finally:
            cluster.shutdown()

    def auth_provider(self) -> Any:
        if not self.authenticator:
            return None
        from cassandra.auth import PlainTextAuthProvider

        return PlainTextAuthProvider(*SUPERUSER)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, *, kill: bool = False, timeout: float = 60.0, keep_data: bool = False) -> None:
        """Stop the node: SIGTERM (Cassandra drains), SIGKILL after ``timeout``; ``kill``: at
        once, as a crash. A throwaway data directory is removed unless ``keep_data``."""
        if self.process is not None:
            stop_pid(self.process.pid, kill=kill, timeout=timeout, wait=self.process.wait)
            self.process = None
        if self.throwaway and not keep_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def state(self) -> NodeState:
        assert self.process is not None
        return NodeState(
            pid=self.process.pid, host=self.host, port=self.port, storage_port=self.storage_port,
            data_dir=str(self.data_dir), log=str(self.log_path), version=self.version,
            authenticator=self.authenticator, throwaway=self.throwaway,
        )  # fmt: skip

    def __enter__(self) -> LocalCassandra:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_pid(pid: int, *, kill: bool = False, timeout: float = 60.0, wait: Callable[[], Any] | None = None) -> None:
    """SIGTERM (or SIGKILL with ``kill``) ``pid`` and wait until it is gone; SIGKILL after ``timeout``."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
        time.sleep(0.1)
    if wait is not None:
        wait()
