"""``journal cassandra local start|stop|status``: a single Cassandra node for development.

``start`` resolves Cassandra from Maven Central on first use (cached), starts the node detached
on free ports and records it in a state file under the cache directory; ``status`` prints its
contact point; ``stop`` stops it (and removes a throwaway data directory).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from . import app

cassandra_app = typer.Typer(help="Cassandra helpers for development.", no_args_is_help=True)
local_app = typer.Typer(help="A local single-node Cassandra (resolved from Maven Central).", no_args_is_help=True)
cassandra_app.add_typer(local_app, name="local")
app.add_typer(cassandra_app, name="cassandra")

StateDirOption = Annotated[
    Path | None,
    typer.Option(help="Directory of the node's state file (default: the user cache dir; one node per directory)."),
]


@local_app.command("start")
def start(
    data_dir: Annotated[
        Path | None, typer.Option(help="Keep the node's data here (default: a throwaway directory, removed on stop).")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on (127.0.0.x).")] = "127.0.0.1",
    port: Annotated[int | None, typer.Option(help="CQL port (default: a free one).")] = None,
    heap: Annotated[str, typer.Option(help="JVM heap (-Xms/-Xmx), at most 1G is plenty.")] = "512M",
    auth: Annotated[bool, typer.Option("--auth", help="PasswordAuthenticator (user cassandra/cassandra).")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait until CQL answers.")] = 240.0,
    state_dir: StateDirOption = None,
) -> None:
    """Start a node in the background and wait until CQL answers; print its contact point."""
    from ..cassandra.local import LocalCassandra, NodeState

    state = NodeState.load(state_dir)
    if state is not None and state.alive():
        typer.echo(f"already running (pid {state.pid}): {state.contact_point}")
        return
    if state is not None and state.throwaway:  # it died: its throwaway data goes
        shutil.rmtree(state.data_dir, ignore_errors=True)
    node = LocalCassandra(data_dir, host=host, port=port, heap=heap, authenticator=auth, startup_timeout=timeout)
    node.start(detach=True)
    node.state().save(state_dir)
    typer.echo(f"Cassandra {node.version} running (pid {node.state().pid}), data in {node.data_dir}")
    _print_contact(node.contact_point, auth)


@local_app.command("status")
def status(state_dir: StateDirOption = None) -> None:
    """Print the contact point of the running node (exit code 1 when none runs)."""
    from ..cassandra.local import NodeState

    state = NodeState.load(state_dir)
    if state is None or not state.alive():
        typer.echo("no local Cassandra running (journal cassandra local start)")
        raise typer.Exit(1)
    typer.echo(f"Cassandra {state.version} running (pid {state.pid}), data in {state.data_dir}, log {state.log}")
    _print_contact(state.contact_point, state.authenticator)


@local_app.command("stop")
def stop(
    timeout: Annotated[float, typer.Option(help="Seconds to wait for a clean shutdown before SIGKILL.")] = 60.0,
    state_dir: StateDirOption = None,
) -> None:
    """Stop the running node (a throwaway data directory is removed)."""
    from ..cassandra.local import NodeState, stop_pid

    state = NodeState.load(state_dir)
    if state is None:
        typer.echo("no local Cassandra recorded")
        return
    if state.alive():
        stop_pid(state.pid, timeout=timeout)
    if state.throwaway:
        shutil.rmtree(state.data_dir, ignore_errors=True)
    NodeState.path(state_dir).unlink(missing_ok=True)
    typer.echo(f"stopped Cassandra (pid {state.pid})")


def _print_contact(contact_point: str, auth: bool) -> None:
    typer.echo(f"contact point: {contact_point}")
    typer.echo(f"  export CASSANDRA_CONTACT_POINTS={contact_point}")
    typer.echo(f"  journal cassandra-schema --create --dsn cassandra://{contact_point}/demo")
    typer.echo(f"  open_journal('cassandra://{contact_point}/demo')")
    if auth:
        typer.echo("  username cassandra, password cassandra")
