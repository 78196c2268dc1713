"""A real single-node Apache Kafka broker (KRaft mode) for development and the tests.

Kafka's jars are on Maven Central: Maven resolves ``org.apache.kafka:kafka_2.13`` and its runtime
dependencies once into the user's cache directory (``<user_cache_dir>/slice-journal/kafka-<version>
/lib``). A broker then runs as one JVM that is both KRaft controller and broker: its storage is
formatted (``kafka.tools.StorageTool format --standalone``), then ``kafka.Kafka server.properties``
starts on two free loopback ports (clients and controller), and :meth:`LocalKafka.start` waits
until the broker answers a Kafka request (ApiVersions) on its client port.
"""

from __future__ import annotations

import base64
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from journal import maven_jars
from journal.cassandra.local import cache_root, free_port, log_tail, stop_pid
from journal.errors import KafkaSetupError, KafkaStartError

DEFAULT_VERSION = "4.1.1"
"""The ``org.apache.kafka:kafka_2.13`` release run here (Java 17, KRaft only)."""

SLF4J_VERSION = "1.7.36"
"""Kafka 4.1 logs through SLF4J 1.7; ``slf4j-simple`` of the same line writes its log."""

JVM_FLAGS = (
    "-XX:+UseSerialGC",  # one small broker: the fastest start and the least CPU on a shared machine
    "-XX:TieredStopAtLevel=1",  # C1 only: a faster start; a test broker never runs long enough for C2
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.net.preferIPv4Stack=true",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
)

Progress = maven_jars.Progress


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


JARS = maven_jars.JarSet(
    "kafka", "a local Kafka broker", KafkaSetupError,
    ("org.apache.kafka:kafka_2.13:{version}", f"org.slf4j:slf4j-simple:{SLF4J_VERSION}"),
)  # fmt: skip


def ensure_jars(version: str = DEFAULT_VERSION, cache: Path | None = None, progress: Progress = _stderr) -> Path:
    """The ``lib`` directory holding kafka_2.13 ``version`` and its runtime dependencies."""
    return JARS.ensure(version, cache or cache_root(), progress)


@dataclass(frozen=True)
class Quorum:
    """The KRaft controllers of a cluster of several nodes (each one broker and controller): every
    node's storage is formatted with the same ``cluster_id`` and lists the same ``voters``."""

    cluster_id: str
    voters: str
    """``id@host:port,...``: each node's id and controller port."""
    replicas: int
    """The replication factor of the internal topics and new topics; ``min.insync.replicas`` is
    one less (at least 1): one node down, a transaction still commits."""


def new_cluster_id() -> str:
    """A random KRaft cluster id (the storage tool's parser takes a leading '-' for an option)."""
    cluster_id = "-"
    while cluster_id.startswith("-"):
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    return cluster_id


def server_properties(
    data: Path, host: str, port: int, controller_port: int, node_id: int = 1, advertised_port: int | None = None,
    *, quorum: Quorum | None = None, users: Mapping[str, str] | None = None,
) -> str:  # fmt: skip
    """A KRaft ``server.properties``: broker and controller in one process, no automatic topic
    creation (a missing topic is an error to see). Alone (no ``quorum``): internal topics with
    one replica. ``advertised_port``: the port clients are told to connect to (a relay's), else
    ``port``. ``users`` (name -> password): the client listener takes SASL/PLAIN logins of these
    users only, and an authorizer allows what ACLs allow (the first user is a super user)."""
    replicas = quorum.replicas if quorum else 1
    min_isr = max(1, replicas - 1)
    controllers = (
        f"controller.quorum.voters={quorum.voters}"
        if quorum
        else f"controller.quorum.bootstrap.servers={host}:{controller_port}"
    )
    client = "SASL_PLAINTEXT" if users else "PLAINTEXT"
    text = f"""\
process.roles=broker,controller
node.id={node_id}
{controllers}
listeners={client}://{host}:{port},CONTROLLER://{host}:{controller_port}
advertised.listeners={client}://{host}:{advertised_port or port}
controller.listener.names=CONTROLLER
listener.security.protocol.map={client}:{client},CONTROLLER:PLAINTEXT
inter.broker.listener.name={client}
log.dirs={data / "logs"}
num.partitions=1
default.replication.factor={replicas}
min.insync.replicas={min_isr}
num.network.threads=2
num.io.threads=2
auto.create.topics.enable=false
offsets.topic.replication.factor={replicas}
offsets.topic.num.partitions=1
transaction.state.log.replication.factor={replicas}
transaction.state.log.min.isr={min_isr}
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor={replicas}
share.coordinator.state.topic.min.isr={min_isr}
group.initial.rebalance.delay.ms=0
"""
    if users:
        admin, password = next(iter(users.items()))
        logins = " ".join(f'user_{name}="{secret}"' for name, secret in users.items())
        text += f"""\
sasl.enabled.mechanisms=PLAIN
sasl.mechanism.inter.broker.protocol=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule \
required username="{admin}" password="{password}" {logins};
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
allow.everyone.if.no.acl.found=false
super.users=User:{admin};User:ANONYMOUS
"""  # ANONYMOUS: the controller listener's (plaintext) peers, the broker and controllers themselves
    return text


def _api_versions_answer(host: str, port: int) -> bool:
    """True when a Kafka broker answers an ApiVersions request (v0) on ``host:port``."""
    client = b"slice-journal"
    body = struct.pack(">hhih", 18, 0, 1, len(client)) + client
    try:
        with socket.create_connection((host, port), timeout=1.0) as s:
            s.sendall(struct.pack(">i", len(body)) + body)
            head = s.recv(8)
    except OSError:
        return False
    return len(head) == 8 and struct.unpack(">ii", head)[1] == 1


class LocalKafka:
    """One KRaft broker+controller on ``host`` with free ports; data in a throwaway directory
    (removed on :meth:`stop`) made in ``storage`` (default: the system's temporary directory; a
    RAM disk keeps a disk's writeback out of a benchmark). Use as a context manager, or
    :meth:`start` / :meth:`stop`.
    ``users`` (name -> password): SASL/PLAIN logins and ACLs (:func:`server_properties`); a node
    of a :class:`LocalKafkaCluster` has its ``node_id`` and the cluster's ``quorum``."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        heap: str = "512M",
        version: str = DEFAULT_VERSION,
        cache: Path | None = None,
        startup_timeout: float = 120.0,
        progress: Progress = _stderr,
        users: Mapping[str, str] | None = None,
        node_id: int = 1,
        storage: Path | None = None,
    ) -> None:
        self.host = host
        self.port = free_port(host)
        self.controller_port = free_port(host)
        self.heap = heap
        self.version = version
        self.cache = cache
        self.startup_timeout = startup_timeout
        self.progress = progress
        self.users = dict(users or {})
        self.node_id = node_id
        self.quorum: Quorum | None = None
        """Set by :class:`LocalKafkaCluster` before :meth:`start`."""
        self.data_dir = Path(tempfile.mkdtemp(prefix="sj-kafka-", dir=storage))
        self.advertised_port: int | None = None
        """Set before :meth:`start` to tell clients another port (a relay's in front of ``port``)."""
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        """``host:port``, the form a client's ``bootstrap.servers`` takes."""
        return f"{self.host}:{self.advertised_port or self.port}"

    def client_config(self, user: str | None = None, password: str | None = None) -> dict[str, str]:
        """librdkafka settings of a client of this broker: ``bootstrap.servers``, and with
        ``users``, a SASL/PLAIN login as ``user`` (the first user, a super user, by default) with
        its password unless ``password`` is given (a wrong one, say)."""
        conf = {"bootstrap.servers": self.bootstrap_servers}
        if self.users:
            name = user or next(iter(self.users))
            conf |= {
                "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
                "sasl.username": name, "sasl.password": self.users[name] if password is None else password,
            }  # fmt: skip
        return conf

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    def _java(self, lib: Path, *args: str) -> list[str]:
        java, _ = JARS.require_tools()
        return [java, f"-Xms{self.heap}", f"-Xmx{self.heap}", *JVM_FLAGS, "-cp", f"{lib}/*", *args]

    def start(self) -> LocalKafka:
        """Format the storage, start the broker and wait until it answers (:class:`KafkaStartError`
        with the log's tail otherwise)."""
        _start([self], self.stop)
        return self

    def launch(self) -> None:
        """Format the storage and start the broker's process (not waiting for it to answer: the
        nodes of a cluster answer once a majority of its controllers runs)."""
        lib = ensure_jars(self.version, self.cache, self.progress)
        props = self.data_dir / "server.properties"
        props.write_text(
            server_properties(
                self.data_dir, self.host, self.port, self.controller_port, self.node_id, self.advertised_port,
                quorum=self.quorum, users=self.users,
            ),
            "utf-8",
        )  # fmt: skip
        cluster_id = self.quorum.cluster_id if self.quorum else new_cluster_id()
        alone = [] if self.quorum else ["--standalone"]  # a cluster's voters are in the properties
        fmt = subprocess.run(
            self._java(lib, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props), *alone),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if fmt.returncode != 0:
            raise KafkaStartError(f"formatting the broker's storage failed:\n{fmt.stdout}{fmt.stderr}")
        self._spawn(lib)

    def _spawn(self, lib: Path) -> None:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self._java(lib, "kafka.Kafka", str(self.data_dir / "server.properties")),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.data_dir,
            )  # fmt: skip

    def restart(self, *, kill: bool = False) -> None:
        """Stop the broker (``kill``: SIGKILL) and start it again on the same ports and data."""
        self.halt(kill=kill)
        self.resume()

    def halt(self, *, kill: bool = False) -> None:
        """Stop the broker (``kill``: SIGKILL) and keep its data: :meth:`resume` starts it again."""
        assert self.process is not None, "the broker is not running"
        stop_pid(self.process.pid, kill=kill, timeout=30.0, wait=self.process.wait)
        self.process = None

    def resume(self) -> None:
        """Start the halted broker again on the same ports and data, and wait until it answers."""
        assert self.process is None, "the broker is running"
        self._spawn(ensure_jars(self.version, self.cache, self.progress))
        self.wait_until_ready()

    def wait_until_ready(self) -> None:
        """Poll until the broker answers ApiVersions on its client port."""
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise KafkaStartError(
                    f"Kafka exited with code {self.process.returncode} while starting; {self.log_path}:\n"
                    + log_tail(self.log_path)
                )
            if _api_versions_answer(self.host, self.port):
                return
            time.sleep(0.1)
        raise KafkaStartError(
            f"Kafka did not answer on {self.bootstrap_servers} within {self.startup_timeout:.0f} s; "
            f"{self.log_path}:\n{log_tail(self.log_path)}"
        )

    def stop(self, *, kill: bool = False, timeout: float = 30.0) -> None:
        """Stop the broker (SIGTERM, SIGKILL after ``timeout``; ``kill``: at once) and remove its data."""
        if self.process is not None:
            stop_pid(self.process.pid, kill=kill, timeout=timeout, wait=self.process.wait)
            self.process = None
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LocalKafkaCluster:
    """``size`` KRaft nodes (each broker and controller) of one cluster on free loopback ports:
    the internal topics and new topics replicated ``size`` times, ``min.insync.replicas`` one less
    (:class:`Quorum`). ``nodes[i]`` restarts or halts one node (:class:`LocalKafka`)."""

    def __init__(self, size: int = 3, *, heap: str = "384M", **node: Any) -> None:
        self.nodes = [LocalKafka(heap=heap, node_id=i + 1, **node) for i in range(size)]
        voters = ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in self.nodes)
        quorum = Quorum(new_cluster_id(), voters, size)
        for n in self.nodes:
            n.quorum = quorum

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.bootstrap_servers for n in self.nodes)

    def start(self) -> LocalKafkaCluster:
        """Start every node, then wait until each answers (they answer once a majority of the
        controllers runs); every node stopped on failure."""
        _start(self.nodes, self.stop)
        return self

    def stop(self) -> None:
        """Stop every node (SIGKILL: the data goes too, and a node stopped gently waits for the
        quorum the others' stops take away) and remove its data."""
        for n in self.nodes:
            n.stop(kill=True)

    def __enter__(self) -> LocalKafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _start(nodes: Sequence[LocalKafka], stop: Callable[[], None]) -> None:
    """Launch every node, then wait until each answers; ``stop`` on any failure (Ctrl-C too), so
    no broker process outlives a start that did not return."""
    try:
        for n in nodes:
            n.launch()
        for n in nodes:
            n.wait_until_ready()
    except BaseException:
        stop()
        raise
