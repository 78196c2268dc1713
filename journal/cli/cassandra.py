"""``journal cassandra-schema [--create]``: print or apply the Cassandra keyspace and tables."""

from __future__ import annotations

from typing import Annotated

import typer

from . import app
from .common import settings_from


@app.command("cassandra-schema")
def cassandra_schema(
    dsn: Annotated[
        str | None,
        typer.Option("--dsn", help="cassandra://host1,host2[:port]/keyspace: the keyspace, and where --create goes."),
    ] = None,
    keyspace: Annotated[str | None, typer.Option(help="Keyspace name (default: the DSN's, else akka).")] = None,
    create: Annotated[bool, typer.Option("--create", help="Apply it (a DEVELOPMENT convenience).")] = False,
    contact_points: Annotated[str | None, typer.Option(hidden=True, help="Old form of --dsn: host1,host2.")] = None,
    port: Annotated[int | None, typer.Option(hidden=True, help="Old form of --dsn: the CQL port.")] = None,
) -> None:
    """Print the CQL of the keyspace and tables (the reference's), or create them with --create.

    Creating the schema from an application is for development only: in production create the
    keyspace once, by hand, with NetworkTopologyStrategy and replication factor >= 3.
    """
    from ..cassandra.connections import parse_target
    from ..cassandra.cql import schema_statements
    from ..errors import InvalidArgument

    if dsn is not None and (contact_points is not None or port is not None):
        raise InvalidArgument("give either --dsn or the old --contact-points/--port, not both")
    target = dsn or f"cassandra://{contact_points or '127.0.0.1'}:{port or 9042}/{keyspace or 'akka'}"
    hosts, cql_port, dsn_keyspace = parse_target(target)
    keyspace = keyspace or dsn_keyspace
    stmts = schema_statements(keyspace)
    if not create:
        typer.echo(";\n\n".join(stmts) + ";")
        return
    from ..cassandra.connections import connect_error, map_error
    from ..cassandra.session import build_cluster

    cluster = build_cluster(hosts, cql_port, settings_from().cassandra)
    where = f"{','.join(hosts)}:{cql_port}"
    try:
        try:
            session = cluster.connect()
        except Exception as e:
            raise connect_error(where, e) from e
        for s in stmts:
            try:
                session.execute(s)
            except Exception as e:
                mapped = map_error(e)
                if mapped is e:
                    raise
                raise mapped from e
    finally:
        cluster.shutdown()
    typer.echo(f"created keyspace {keyspace} and its tables on {where} (development convenience)")
