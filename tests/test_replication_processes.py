"""Replication between endpoint processes: three locations (three databases), gRPC on 127.0.0.x.

Each location's application is this test process writing to that location's own database; the
endpoints replicate. Checked: the same events everywhere, each exactly once, after concurrent
writes, a partition and a heal, ``kill -9`` in the middle of batches (target and source), a chain
topology, causal order at a live slice query, status and availability through the CLI.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from endpoint_processes import ROOT, EndpointProcess, free_address, make_tls
from replication_helpers import Location, location_databases, open_locations

from journal.replication.entity import ReplicatedEntities, ReplicatedEntity
from tests.support.waiting import wait_until

LOG = "Order"


class Register(ReplicatedEntity[dict[str, Any]]):
    entity_type = LOG

    def initial_state(self) -> dict[str, Any]:
        return {"value": None, "writes": 0}

    def on_event(self, state: dict[str, Any], event: Any) -> dict[str, Any]:
        return {"value": event["v"], "writes": state["writes"] + 1}


NAMES = ["A", "B", "C"]


@pytest.fixture(scope="module")
def dbs(server_dsn: str) -> Iterator[dict[str, str]]:
    with location_databases(server_dsn, NAMES) as d:
        yield d


@pytest.fixture
async def locs(dbs: dict[str, str]) -> AsyncIterator[dict[str, Location]]:
    async with open_locations(dbs, [LOG]) as opened:
        yield opened


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., EndpointProcess]]:
    started: list[EndpointProcess] = []

    def make(config: dict[str, Any], tls: bool = False) -> EndpointProcess:
        ep = EndpointProcess(tmp_path, config, make_tls(tmp_path / "tls") if tls else None)
        started.append(ep)
        return ep

    yield make
    for ep in started:
        ep.stop()


def topology(dbs: dict[str, str], links: dict[str, list[str]], **extra: Any) -> dict[str, dict[str, Any]]:
    """Endpoint configs: ``links[X]`` are the locations X pulls from."""
    addresses = {n: free_address() for n in links}
    return {
        n: {
            "location": n, "dsn": dbs[n], "listen": addresses[n], "logs": [LOG],
            "connections": [{"address": addresses[m]} for m in links[n]],
            "retry_delay": 0.5, "failure_detection_limit": 3.0, **extra,
        }
        for n in links
    }  # fmt: skip


async def converged(locs: dict[str, Location], expected: int) -> bool:
    ids = [await loc.store.event_ids(LOG) for loc in locs.values()]
    return all(len(i) == expected for i in ids)


async def assert_same_events_exactly_once(locs: dict[str, Location], expected: int) -> None:
    ids = [await loc.store.event_ids(LOG) for loc in locs.values()]
    assert all(set(i) == set(ids[0]) for i in ids)
    assert len(ids[0]) == expected
    for i in ids:
        assert set(i.values()) == {1}, "an event is stored twice"
    for loc in locs.values():  # and nothing unstamped or foreign is left over
        n = 0
        async for _ in loc.journal.current_events_by_slices(LOG, 0, 1023):
            n += 1
        assert n == expected


async def write(loc: Location, prefix: str, n: int) -> None:
    await asyncio.gather(*(loc.journal.persist(f"{LOG}|{prefix}{i % 5}", [{"v": f"{prefix}{i}"}]) for i in range(n)))


@pytest.mark.slow
async def test_concurrent_writes_partition_and_heal_over_tls(
    dbs: dict[str, str], locs: dict[str, Location], spawn: Callable[..., EndpointProcess]
) -> None:
    configs = topology(dbs, {"A": ["B", "C"], "B": ["A", "C"], "C": ["A", "B"]})
    eps = {n: spawn(c, tls=True) for n, c in configs.items()}
    for ep in eps.values():
        ep.start()
    for ep in eps.values():
        await ep.wait_ready()
    await asyncio.gather(*(write(loc, n.lower(), 30) for n, loc in locs.items()))
    await wait_until(lambda: converged(locs, 90), 180, "first convergence", every=0.2)
    eps["C"].stop()  # partition: C's endpoint is away, its application goes on writing
    await asyncio.gather(*(write(loc, n.lower() + "p", 20) for n, loc in locs.items()))
    entities = {n: ReplicatedEntities(loc.journal, loc.store) for n, loc in locs.items()}
    for n in NAMES:  # one entity written at every location, C's write concurrent with the others
        await entities[n].persist(Register("shared"), [{"v": f"shared-{n}"}])
    await wait_until(lambda: converged({k: locs[k] for k in "AB"}, 90 + 40 + 2), 180, "A and B to exchange", every=0.2)
    assert len(await locs["C"].store.event_ids(LOG)) < 150
    eps["C"].start()  # heal
    await eps["C"].wait_ready()
    await wait_until(lambda: converged(locs, 153), 180, "convergence after the heal", every=0.2)
    await assert_same_events_exactly_once(locs, 153)
    states = [await entities[n].load(Register("shared")) for n in NAMES]
    assert states[0].state == states[1].state == states[2].state
    assert states[0].state["writes"] == 3
    assert states[0].vector_time == states[1].vector_time == states[2].vector_time
    assert [v.concurrent for v in states[0].versions] == [v.concurrent for v in states[2].versions]
    assert any(v.concurrent for v in states[0].versions), "C wrote during the partition: concurrent with A, B"


@pytest.mark.slow
async def test_kill_9_mid_batch_on_both_sides_in_a_chain(
    dbs: dict[str, str], locs: dict[str, Location], spawn: Callable[..., EndpointProcess]
) -> None:
    # chain A - B - C: C never talks to A
    # small batches and a fast poll: on a quiet machine B replicates all 700 in well under a second
    configs = topology(dbs, {"A": ["B"], "B": ["A", "C"], "C": ["B"]}, batch_size=5)
    eps = {n: spawn(c) for n, c in configs.items()}
    await write(locs["A"], "a", 600)
    await write(locs["C"], "c", 100)
    for ep in eps.values():
        ep.start()
    b_ids = locs["B"].store.event_ids

    async def b_has_some() -> bool:
        return 0 < len(await b_ids(LOG)) < 700

    await wait_until(b_has_some, 180, "B to be in the middle of replicating", every=0.005)
    eps["B"].kill9()  # the target dies mid-batch
    eps["B"].start()
    await eps["B"].wait_ready()

    async def c_has_some_of_a() -> bool:
        return any(origin == "A" for origin, _ in await locs["C"].store.event_ids(LOG))

    await wait_until(c_has_some_of_a, 180, "A's events to reach C through B", every=0.2)
    eps["A"].kill9()  # the source dies while serving
    await write(locs["A"], "a2", 50)
    eps["A"].start()
    await wait_until(lambda: converged(locs, 750), 180, "convergence in the chain", every=0.2)
    await assert_same_events_exactly_once(locs, 750)


async def _between(loc: Location, low: int, high: int) -> bool:
    return low <= len(await loc.store.event_ids(LOG)) < high


@pytest.mark.slow
async def test_a_causal_chain_is_never_delivered_out_of_order(
    dbs: dict[str, str], locs: dict[str, Location], spawn: Callable[..., EndpointProcess]
) -> None:
    configs = topology(dbs, {"A": ["B", "C"], "B": ["A", "C"], "C": ["A", "B"]})
    eps = {n: spawn(c) for n, c in configs.items()}
    for ep in eps.values():
        ep.start()
    for ep in eps.values():
        await ep.wait_ready()
    delivered: dict[str, list[str]] = {n: [] for n in NAMES}

    async def follow(name: str) -> None:  # a live slice query at every location
        async for env in locs[name].journal.events_by_slices(LOG, 0, 1023):
            delivered[name].append(env.event["v"])

    followers = [asyncio.create_task(follow(n)) for n in NAMES]
    try:
        for k in range(5):
            await locs["A"].journal.persist(f"{LOG}|cause{k}", [{"v": f"e1-{k}"}])

            async def b_saw_it(k: int = k) -> bool:
                return f"e1-{k}" in delivered["B"]

            await wait_until(b_saw_it, 180, "B to see e1", every=0.2)
            await locs["B"].journal.persist(f"{LOG}|effect{k}", [{"v": f"e2-{k}"}])
        await wait_until(_all_delivered(delivered, 10), 180, "every chain everywhere", every=0.2)
    finally:
        for f in followers:
            f.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
    for name, seen in delivered.items():
        for k in range(5):
            assert seen.index(f"e1-{k}") < seen.index(f"e2-{k}"), f"{name} delivered an effect before its cause"
        assert len(seen) == len(set(seen)) == 10


def _all_delivered(delivered: dict[str, list[str]], n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return all(len(set(v)) >= n for v in delivered.values())

    return check


@pytest.mark.slow
async def test_status_cli_shows_progress_and_availability(
    dbs: dict[str, str], locs: dict[str, Location], spawn: Callable[..., EndpointProcess]
) -> None:
    configs = topology(dbs, {"A": ["B"], "B": ["A"]})
    eps = {n: spawn(c) for n, c in configs.items()}
    for ep in eps.values():
        ep.start()
    for ep in eps.values():
        await ep.wait_ready()
    await write(locs["A"], "s", 10)
    await wait_until(lambda: _between(locs["B"], 10, 11), 180, "B to replicate", every=0.2)

    def status() -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-c", "from journal.cli import main; main()", "endpoint", "status", "--config",
             str(eps["B"].path)],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        result: dict[str, Any] = json.loads(out.stdout)
        return result

    async def state_is(want: str) -> bool:
        s = await asyncio.to_thread(status)
        return bool(s["connections"][0]["logs"][LOG]["state"] == want)

    await wait_until(lambda: state_is("available"), 30, "A available at B", every=0.2)
    s = await asyncio.to_thread(status)
    assert s["location"] == "B" and s["connections"][0]["location"] == "A"
    assert s["logs"][LOG]["progress"]["A"] >= 10
    assert s["logs"][LOG]["version_vector"]["A"] >= 10
    t0 = time.monotonic()
    eps["A"].stop()
    await wait_until(lambda: state_is("unavailable"), 30, "A unavailable at B", every=0.2)
    assert time.monotonic() - t0 < 3.0 * 2 + 5  # within about two failure-detection limits
