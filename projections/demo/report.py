"""The demo's closing figures that are computed, not printed as they are: whether the projection
kept pace with the writes, and its latency in steady state and across the kill."""

from __future__ import annotations

from typing import Any


def pace(backlog: int, rate: float, catch_up: float) -> str:
    """Whether the projection kept pace: when the writes stopped, at most one second of writes
    was still to be projected."""
    if backlog <= rate:
        return f"kept pace with the writes ({backlog} events behind when they stopped, caught up {catch_up:.1f}s later)"
    return (
        f"fell behind the writes ({backlog} events, {backlog / rate:.1f}s of writes, still to project when "
        f"they stopped; caught up {catch_up:.1f}s later)"
    )


def latency_rows(rows: list[Any]) -> list[tuple[str, str]]:
    """Commit of an event -> commit of its read-model row, in steady state (events before the kill)
    and across the kill, the takeover and the rescale: a killed worker's slices wait until its
    leases expire (``lease_ttl``, 3 s here) and another worker resumes from their offsets."""
    label = {True: "latency, steady state", False: "latency, across the kill"}
    why = {True: "(before the kill)", False: "(from the kill on: its slices wait for lease expiry and takeover)"}
    return [
        (label[r["steady"]], f"p50 {r['p50'] * 1000:.0f} ms, p99 {r['p99'] * 1000:.0f} ms, max {r['mx']:.1f} s "
                             + why[r["steady"]])
        for r in sorted(rows, key=lambda r: not r["steady"])
    ]  # fmt: skip
