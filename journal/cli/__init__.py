"""The ``journal`` command line: migrate, info, demo (and backend-specific extras).

Subcommands live in small modules that register themselves on :data:`app`. Commands of other
packages (``journal demo`` lives in ``projections``, which ``journal`` never imports) are found
through the ``slice_journal.cli`` entry-point group: each entry is a ``register(app)`` function.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from .common import root_app
from .failures import configure_logging, run_app

app = root_app("journal", "slice-journal: an event journal on PostgreSQL (slices, projections, Spark, Cassandra).")
"""Exit codes: 0 done, 1 failed, 2 usage or configuration, 3 unavailable (see docs/troubleshooting.md)."""

from . import cassandra as _cassandra  # noqa: E402,F401
from . import cassandra_local as _cassandra_local  # noqa: E402,F401
from . import cleanup as _cleanup  # noqa: E402,F401
from . import endpoint as _endpoint  # noqa: E402,F401
from . import forget as _forget  # noqa: E402,F401
from . import manifests as _manifests  # noqa: E402,F401
from . import migrate as _migrate  # noqa: E402,F401  (registers commands)
from . import partitions as _partitions  # noqa: E402,F401
from . import timestamp_rule as _timestamp_rule  # noqa: E402,F401

ENTRY_POINT_GROUP = "slice_journal.cli"
"""Entry points named by command, each a ``register(app: typer.Typer) -> None`` function."""


def _register_extensions() -> None:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        ep.load()(app)


_register_extensions()


def main() -> None:
    """Console script entry point (also ``python -m journal``): one line per failure (see :mod:`.failures`)."""
    configure_logging("%(levelname)s %(name)s: %(message)s")
    run_app(app, "journal")
