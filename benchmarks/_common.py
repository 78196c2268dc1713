"""Shared benchmark plumbing: a fresh migrated database, a results printer, and the rounds that
alternate a row's sides (:func:`alternate`).

The server is ``JOURNAL_DSN`` when set, else an embedded PostgreSQL in a temporary directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
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

    def server_now(self) -> float | None:
        """The server's CPU seconds so far (None when it is not a local process)."""
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
        self._c0, self._s0 = time.process_time(), self.server_now()

    def stop(self) -> None:
        self.client = time.process_time() - self._c0
        s1 = self.server_now()
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


@dataclasses.dataclass
class Rounds:
    """Rates of a row's sides measured round by round (:func:`alternate`): every round runs each
    side once, in an order rotated from round to round, so the table's growth, a warming server
    and the shared machine's load weigh on all sides alike. A ratio is the median of the rounds'
    own ratios (each from sides run back to back), never one side's best against another's."""

    rates: dict[str, list[float]]
    loads: list[float] = dataclasses.field(default_factory=list)
    """The 1-minute load average at the start of each round."""

    def median(self, side: str) -> float:
        return statistics.median(self.rates[side])

    def ratios(self, side: str, of: str) -> list[float]:
        return [a / b for a, b in zip(self.rates[side], self.rates[of], strict=True)]

    def ratio(self, side: str, of: str) -> float:
        return statistics.median(self.ratios(side, of))

    def load(self) -> str:
        return f"load {min(self.loads):.2f}-{max(self.loads):.2f}" if self.loads else "load n/a"

    def report(self, name: str, side: str, of: str, unit: str = "rows/s", target: float | None = None) -> None:
        """One line: the sides' median rates, the median of the paired rounds' ratios against the
        goal, and below it each round's ratio and the load average the rounds ran at."""
        ratio = self.ratio(side, of)
        verdict = "" if target is None else ("  OK" if ratio >= target else f"  BELOW target {target}")
        print(f"{name:<44} {side} {self.median(side):>10,.0f} {unit}   {of} {self.median(of):>10,.0f} {unit}"
              f"   ratio {ratio:.2f}{verdict}")  # fmt: skip
        rounds = " ".join(f"{r:.2f}" for r in self.ratios(side, of))
        print(f"    median of {len(self.loads)} paired rounds (order rotated): ratios {rounds}; {self.load()}")


def _order(sides: list[str], k: int) -> list[str]:
    return sides[k % len(sides) :] + sides[: k % len(sides)]


def alternate(rounds: int, sides: dict[str, Callable[[int], float]]) -> Rounds:
    """Run every side once per round (``side(round)`` returns its rate), rotating their order."""
    out = Rounds({name: [] for name in sides})
    for k in range(rounds):
        out.loads.append(_load())
        for name in _order(list(sides), k):
            out.rates[name].append(sides[name](k))
    return out


async def alternate_async(rounds: int, sides: dict[str, Callable[[int], Awaitable[float]]]) -> Rounds:
    """:func:`alternate` for sides that are coroutines run on the caller's loop."""
    out = Rounds({name: [] for name in sides})
    for k in range(rounds):
        out.loads.append(_load())
        for name in _order(list(sides), k):
            out.rates[name].append(await sides[name](k))
    return out


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
