"""Turning the journal's DSN into what Spark's JDBC source wants: a URL and properties.

The DSN is the one the rest of the library uses (``postgresql://user:pw@host:port/db``). A DSN
that names a Unix socket (the embedded server) is reached through a loopback TCP bridge when
Spark's executors run on this machine (local mode, or a cluster on loopback); a remote cluster
cannot reach it, which is a clear error. A DSN without a password gets the one libpq would find
(:class:`journal.postgres.Passwords`: the password file, ``PGPASSWORD``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from journal.errors import SparkSetupError
from journal.postgres import Passwords, redact, validate_dsn
from journal.settings import validate_identifier

DRIVER_CLASS = "org.postgresql.Driver"

_PASS_THROUGH = (
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "connect_timeout",
    "application_name",
)


@dataclass(frozen=True)
class JdbcSource:
    """A JDBC URL, its connection properties, the original DSN and the journal's schema."""

    url: str
    properties: dict[str, str] = field(repr=False)
    dsn: str = field(repr=False)
    schema: str = "public"

    def table(self, name: str) -> str:
        """``"schema"."name"`` with both identifiers validated."""
        validate_identifier(name, "table")
        return f'"{validate_identifier(self.schema, "schema")}"."{name}"'

    def with_properties(self, **extra: str) -> dict[str, str]:
        return {**self.properties, **extra}


def jdbc_source(dsn: str, schema: str = "public", *, local: bool = True) -> JdbcSource:
    """Build the JDBC URL and properties for ``dsn``.

    ``local``: Spark's executors run on this machine (a ``local[...]`` master, or a cluster
    whose master is on loopback), so a Unix-socket DSN can be bridged over loopback TCP.

    Raises:
        ConfigurationError: not a PostgreSQL DSN.
        SparkSetupError: a Unix-socket DSN with a cluster master.
    """
    validate_dsn(dsn)
    validate_identifier(schema, "schema")
    # JDBC reads neither PGPASSWORD nor every libpq password file: the password is found here
    parts = urlsplit(Passwords().fill(dsn))
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    host = parts.hostname or query.get("host", "")
    port = parts.port or int(query.get("port", "5432"))
    database = unquote(parts.path.lstrip("/")) or query.get("dbname", "") or (parts.username or "postgres")
    props = {"driver": DRIVER_CLASS}
    user = unquote(parts.username) if parts.username else query.get("user")
    if user:
        props["user"] = user
    password = unquote(parts.password) if parts.password else query.get("password")
    if password:
        props["password"] = password
    for k in _PASS_THROUGH:
        if k in query:
            props["connectTimeout" if k == "connect_timeout" else k] = query[k]
    if not host or host.startswith("/"):
        socket_dir = Path(host or "/var/run/postgresql")
        if not local:
            raise SparkSetupError(
                f"the database {redact(dsn)} is reached through a Unix socket, which JDBC on a "
                "Spark cluster cannot use: set JOURNAL_DSN (or --dsn) to a TCP address "
                "(postgresql://user:pw@host:5432/db) that the cluster's executors can reach (a "
                "cluster on this machine, master spark://127.0.0.1:<port>, is bridged)"
            )
        from .bridge import tcp_bridge

        host, port = "127.0.0.1", tcp_bridge(socket_dir / f".s.PGSQL.{port}")
    url_host = f"[{host}]" if ":" in host else host
    return JdbcSource(
        url=f"jdbc:postgresql://{url_host}:{port}/{database}",
        properties=props,
        dsn=dsn,
        schema=schema,
    )
