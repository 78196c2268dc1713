"""The driver's Cluster built from :class:`~journal.settings.CassandraSettings`: authentication,
datacenter-aware routing, timeouts, and the consistency level of each statement."""

from __future__ import annotations

from typing import Any

from ..settings import CassandraSettings


def consistency(name: str) -> int:
    """A validated level name (``"QUORUM"``) as the driver's value."""
    from cassandra import ConsistencyLevel

    return int(ConsistencyLevel.name_to_value[name])


PAGE_PROFILE = "pages"
"""The execution profile whose rows come as dicts by column name: a page of tag rows is handed to
the query as the driver made it (:data:`journal.backend.TagPageRow`), without an object per row."""


def build_cluster(contact_points: list[str], port: int, s: CassandraSettings) -> Any:
    """A ``cassandra.cluster.Cluster`` (not connected): token-aware routing, DC-aware when
    ``local_datacenter`` is set, PlainText authentication when ``username`` is set."""
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import DCAwareRoundRobinPolicy, TokenAwarePolicy
    from cassandra.query import dict_factory

    def profile(**row_factory: Any) -> Any:
        return ExecutionProfile(
            load_balancing_policy=TokenAwarePolicy(DCAwareRoundRobinPolicy(local_dc=s.local_datacenter)),
            consistency_level=consistency(s.read_consistency),
            serial_consistency_level=consistency(s.serial_consistency),
            request_timeout=s.request_timeout,
            **row_factory,
        )

    auth = PlainTextAuthProvider(s.username, s.password) if s.username is not None else None
    return Cluster(
        contact_points,
        port=port,
        auth_provider=auth,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile(), PAGE_PROFILE: profile(row_factory=dict_factory)},
        connect_timeout=s.request_timeout,
    )


def is_read(cql: str) -> bool:
    """Statements that only read get the read consistency; every other one the write consistency."""
    return cql.lstrip().upper().startswith("SELECT")
