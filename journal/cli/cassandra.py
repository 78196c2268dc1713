"""``journal cassandra-schema [--create]``: print or apply the Cassandra keyspace and tables."""

from __future__ import annotations

from typing import Annotated

import typer

from . import app


@app.command("cassandra-schema")
def cassandra_schema(
    keyspace: Annotated[str, typer.Option(help="Keyspace name.")] = "akka",
    create: Annotated[bool, typer.Option("--create", help="Apply it (a DEVELOPMENT convenience).")] = False,
    contact_points: Annotated[str, typer.Option(help="host1,host2 (with --create).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="CQL port.")] = 9042,
) -> None:
    """Print the CQL of the keyspace and tables (the reference's), or create them with --create.

    Creating the schema from an application is for development only: in production create the
    keyspace once, by hand, with NetworkTopologyStrategy and replication factor >= 3.
    """
    from ..cassandra.cql import schema_statements

    stmts = schema_statements(keyspace)
    if not create:
        typer.echo(";\n\n".join(stmts) + ";")
        return
    from cassandra.cluster import Cluster

    cluster = Cluster(contact_points.split(","), port=port)
    try:
        session = cluster.connect()
        for s in stmts:
            session.execute(s)
    finally:
        cluster.shutdown()
    typer.echo(f"created keyspace {keyspace} and its tables (development convenience)")
