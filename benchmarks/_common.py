"""Shared benchmark plumbing: a fresh migrated database and a results printer.

The server is ``JOURNAL_DSN`` when set, else an embedded PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import contextlib
import os
import platform
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from journal.postgres.migrations import upgrade
from tests.support.scratch import scratch_database


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """A new database on the server, migrated to head, dropped afterwards."""
    with fresh_databases(["bench"]) as dsns:
        yield dsns["bench"]


@contextlib.contextmanager
def fresh_databases(names: list[str]) -> Iterator[dict[str, str]]:
    """A new database per name on the server (``JOURNAL_DSN``, else an embedded one), migrated
    to head, dropped afterwards."""
    with contextlib.ExitStack() as stack:
        server = os.environ.get("JOURNAL_DSN")
        if not server:
            from journal.postgres.embedded import start_embedded

            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="sj-bench-"))
            server = start_embedded(Path(tmp) / "pgdata")
        dsns = {n: stack.enter_context(scratch_database(server, f"sjbench{n.lower()}")) for n in names}
        for dsn in dsns.values():
            upgrade(dsn)
        yield dsns


def header(title: str) -> None:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"# {title}")
    print(f"# {platform.node()} cores={os.cpu_count()} load1={load:.2f} python={platform.python_version()}")


def report(name: str, ours: float, raw: float, unit: str = "rows/s", target: float | None = None) -> None:
    ratio = ours / raw if raw else float("nan")
    verdict = "" if target is None else ("  OK" if ratio >= target else f"  BELOW target {target}")
    print(f"{name:<44} journal {ours:>10,.0f} {unit}   raw asyncpg {raw:>10,.0f} {unit}   ratio {ratio:.2f}{verdict}")


class CpuMeter:
    """CPU seconds spent by this process and by the local PostgreSQL server (the postmaster and
    its children) between :meth:`start` and :meth:`stop`: a measure of work that, unlike wall
    time, does not depend on how busy the shared machine is. The server part is read from
    /proc and is None when the server is not a local process (or /proc is not there)."""

    def __init__(self, backend_pid: int) -> None:
        self._postmaster = _stat(backend_pid)[0] if _stat(backend_pid) else None
        self.client = 0.0
        self.server: float | None = None

    def _server_now(self) -> float | None:
        if self._postmaster is None:
            return None
        # the postmaster's own time plus its exited children's (closed connections), plus the
        # time of the children alive now
        total = _stat(self._postmaster, with_children=True)
        if total is None:
            return None
        t = total[1]
        for d in os.listdir("/proc"):
            if d.isdigit():
                st = _stat(int(d))
                if st is not None and st[0] == self._postmaster:
                    t += st[1]
        return t

    def start(self) -> None:
        self._c0, self._s0 = time.process_time(), self._server_now()

    def stop(self) -> None:
        self.client = time.process_time() - self._c0
        s1 = self._server_now()
        self.server = None if s1 is None or self._s0 is None else s1 - self._s0

    def per_1000(self, n: int) -> str:
        server = "n/a" if self.server is None else f"{self.server / n * 1e6:.2f} ms"
        return f"CPU per 1000 events: client {self.client / n * 1e6:.2f} ms, server {server}"


def _stat(pid: int, *, with_children: bool = False) -> tuple[int, float] | None:
    """(parent pid, user+system CPU seconds) of a local process (plus those of its exited,
    waited-for children), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = int(fields[11]) + int(fields[12])
    if with_children:
        ticks += int(fields[13]) + int(fields[14])
    return int(fields[1]), ticks / os.sysconf("SC_CLK_TCK")
