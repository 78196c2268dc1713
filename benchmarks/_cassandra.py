"""Cassandra for the benchmarks: ``CASSANDRA_CONTACT_POINTS`` (``host1,host2[:port]``) when set, else
one local node started by the project's runner (``journal.cassandra.local``) for the run; a fresh
keyspace with the journal's tables either way, dropped afterwards."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from journal.cassandra.connections import parse_target
from journal.cassandra.cql import schema_statements


@dataclass(frozen=True)
class BenchCassandra:
    hosts: list[str]
    port: int
    keyspace: str
    session: Any
    """A plain driver session (the raw ceiling's client)."""

    @property
    def dsn(self) -> str:
        return f"cassandra://{','.join(self.hosts)}:{self.port}/{self.keyspace}"


@contextlib.contextmanager
def cassandra_keyspace() -> Iterator[BenchCassandra]:
    from cassandra.cluster import Cluster

    with contextlib.ExitStack() as stack:
        points = os.environ.get("CASSANDRA_CONTACT_POINTS")
        if points:
            hosts, port, _ = parse_target(f"cassandra://{points}/ks")
        else:
            from journal.cassandra.local import LocalCassandra

            node = stack.enter_context(LocalCassandra())
            hosts, port = [node.host], node.port
        cluster = Cluster(hosts, port=port)
        stack.callback(cluster.shutdown)
        session = cluster.connect()
        ks = f"sjbench_{uuid.uuid4().hex[:8]}"
        for stmt in schema_statements(ks):
            session.execute(stmt, timeout=60)
        stack.callback(session.execute, f"DROP KEYSPACE IF EXISTS {ks}", timeout=120)
        yield BenchCassandra(hosts, port, ks, session)
