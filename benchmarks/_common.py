"""Shared benchmark plumbing: a fresh migrated database and a results printer.

The server is ``JOURNAL_DSN`` when set, else an embedded PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import contextlib
import os
import platform
import tempfile
from collections.abc import Iterator
from pathlib import Path

from journal.postgres.migrations import upgrade
from tests.support.scratch import scratch_database


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """A new database on the server, migrated to head, dropped afterwards."""
    with contextlib.ExitStack() as stack:
        server = os.environ.get("JOURNAL_DSN")
        if not server:
            from journal.postgres.embedded import start_embedded

            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="sj-bench-"))
            server = start_embedded(Path(tmp) / "pgdata")
        with scratch_database(server, "sjbench") as dsn:
            upgrade(dsn)
            yield dsn


def header(title: str) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# {title}")
    print(f"# {platform.node()} cores={os.cpu_count()} load1={load:.2f} python={platform.python_version()}")


def report(name: str, ours: float, raw: float, unit: str = "rows/s", target: float | None = None) -> None:
    ratio = ours / raw if raw else float("nan")
    verdict = "" if target is None else ("  OK" if ratio >= target else f"  BELOW target {target}")
    print(f"{name:<44} journal {ours:>10,.0f} {unit}   raw asyncpg {raw:>10,.0f} {unit}   ratio {ratio:.2f}{verdict}")
