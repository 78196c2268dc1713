"""More replication scenarios with endpoint processes (``journal endpoint run --config FILE``).

The issue's remaining scenarios, each with separate endpoint processes on 127.0.0.x ports over
their own databases: filters from the config file (location-private events never leave; per
source log and per target location, composed with and/or/not), application versions (an
older target is refused and reports its source unavailable), availability within the
failure-detection limit, disaster recovery of a wiped location (``run --recover``), and deferred
deletion (``journal endpoint delete``). The test process is each location's application: it
writes through the library to that location's database, and observes through the databases and
the ``journal endpoint status|delete`` commands.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import truncate_all
from endpoint_processes import JOURNAL_CLI, ROOT, EndpointProcess, free_address
from replication_helpers import Location, location_databases, open_locations

from journal.errors import LocalWritesRefused
from tests.support.waiting import wait_until

LOG = "Order"
NAMES = ["A", "B", "C"]
LIMIT = 2.0  # failure-detection limit of every endpoint here, seconds


@pytest.fixture(scope="module")
def dbs(server_dsn: str) -> Iterator[dict[str, str]]:
    with location_databases(server_dsn, NAMES) as d:
        yield d


@pytest.fixture
async def locs(dbs: dict[str, str]) -> AsyncIterator[dict[str, Location]]:
    async with open_locations(dbs, [LOG]) as opened:
        yield opened


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], EndpointProcess]]:
    started: list[EndpointProcess] = []

    def make(config: dict[str, Any]) -> EndpointProcess:
        ep = EndpointProcess(tmp_path, config)
        started.append(ep)
        return ep

    yield make
    for ep in started:
        ep.stop()


def topology(dbs: dict[str, str], links: dict[str, str], **extra: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Endpoint configs: ``links[X]`` are the locations X pulls from; ``extra[X]`` more keys for X."""
    addresses = {n: free_address() for n in links}
    return {
        n: {
            "location": n, "dsn": dbs[n], "listen": addresses[n], "logs": [LOG],
            "connections": [{"address": addresses[m]} for m in links[n]],
            "retry_delay": 0.2, "failure_detection_limit": LIMIT, **extra.get(n, {}),
        }
        for n in links
    }  # fmt: skip


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*JOURNAL_CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


async def status(ep: EndpointProcess) -> dict[str, Any]:
    out = await asyncio.to_thread(cli, "endpoint", "status", "--config", str(ep.path))
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


async def state_of(ep: EndpointProcess, peer: str) -> dict[str, Any]:
    """The availability of ``peer``'s log as ``ep`` reports it (``journal endpoint status``)."""
    s = await status(ep)
    (conn,) = [c for c in s["connections"] if c["address"] == peer]
    result: dict[str, Any] = conn["logs"][LOG]
    return result


async def count(loc: Location) -> int:
    return len(await loc.store.event_ids(LOG))


async def stored(loc: Location, n: int) -> None:
    async def has_n() -> bool:
        return await count(loc) == n

    await wait_until(has_n, 120, f"{n} events at {loc.name}", every=0.1)


async def local_reads(loc: Location) -> list[Any]:
    return [e.event async for e in loc.journal.current_events_by_slices(LOG, 0, 1023)]


@pytest.mark.slow
async def test_filters_versions_and_availability_within_the_limit(
    dbs: dict[str, str], locs: dict[str, Location], spawn: Callable[[dict[str, Any]], EndpointProcess]
) -> None:
    """A (shop 1.3, tag ``mine`` private) is the source of B (shop 1.2: older, refused) and of
    C (shop 1.3.1). One set of processes for three checks."""
    configs = topology(
        dbs,
        {"A": "", "B": "A", "C": "A"},
        A={
            "application": {"name": "shop", "version": "1.3"},
            "private_tags": ["mine"],
            "filters": {  # drafts stay, except Order|keep's; nothing tagged not-for-c goes to C
                "source_logs": {LOG: {"any": [{"not": {"tagged": ["draft"]}}, {"persistence_ids": [f"{LOG}|keep"]}]}},
                "target_locations": {"C": {"not": {"tagged": ["not-for-c"]}}},
            },
        },
        B={"application": {"name": "shop", "version": "1.2"}},
        C={"application": {"name": "shop", "version": "1.3.1"}},
    )
    eps = {n: spawn(c) for n, c in configs.items()}
    for ep in eps.values():
        ep.start()
    for ep in eps.values():
        await ep.wait_ready()
    a = eps["A"].address
    await locs["A"].journal.persist(f"{LOG}|p", [{"v": "private"}], tags=["mine"])
    await locs["A"].journal.persist(f"{LOG}|x", [{"v": "not for C"}], tags=["not-for-c"])
    await locs["A"].journal.persist(f"{LOG}|d", [{"v": "draft"}], tags=["draft"])
    await locs["A"].journal.persist(f"{LOG}|keep", [{"v": "kept draft"}], tags=["draft"])
    for i in range(5):
        await locs["A"].journal.persist(f"{LOG}|q{i}", [{"v": f"public{i}"}], tags=["other"])

    # filters: C stores what passes them only, although it has read past everything
    await stored(locs["C"], 6)

    async def c_read_all_of_a() -> bool:
        return int(await locs["C"].store.progress(LOG, "A")) >= 9

    await wait_until(c_read_all_of_a, 60, "C to read past every event of A", every=0.1)
    expected = sorted(["kept draft", *(f"public{i}" for i in range(5))])
    assert sorted(e["v"] for e in await local_reads(locs["C"])) == expected
    assert len(await local_reads(locs["A"])) == 9  # filtered, not lost: A still has them all

    # versions: B (older than A) is refused, says why, and stores nothing
    async def b_refused() -> dict[str, Any] | None:
        s = await state_of(eps["B"], a)
        return s if s["state"] == "unavailable" else None

    refused = await wait_until(b_refused, 60, "B to report A unavailable", every=0.2)
    assert any("older" in cause for cause in refused["causes"]), refused
    assert (await state_of(eps["C"], a))["state"] == "available"
    assert await count(locs["B"]) == 0
    assert (await status(eps["B"]))["application"] == {"name": "shop", "version": "1.2"}

    # availability: A goes away, C reports it unavailable within the limit; A back, available again
    async def c_sees(want: str) -> bool:  # timed: the endpoint's status API, not a CLI process start
        info = await eps["C"].info()
        (conn,) = info["connections"]
        return bool(conn["logs"][LOG]["state"] == want)

    t0 = time.monotonic()
    eps["A"].stop()
    await wait_until(lambda: c_sees("unavailable"), 30, "C to report A unavailable", every=0.1)
    took = time.monotonic() - t0
    assert took < 2 * LIMIT + 3.0, f"unavailable after {took:.1f}s, limit {LIMIT}s"
    s = await state_of(eps["C"], a)
    assert s["causes"], "an unavailable endpoint names its causes"
    eps["A"].start()
    await eps["A"].wait_ready()
    t0 = time.monotonic()
    await wait_until(lambda: c_sees("available"), 30, "C to report A available again", every=0.1)
    took = time.monotonic() - t0
    assert took < 2 * LIMIT + 3.0, f"available after {took:.1f}s, limit {LIMIT}s"
    await locs["A"].journal.persist(f"{LOG}|q9", [{"v": "after"}])
    await stored(locs["C"], 7)  # and replication goes on
    assert await count(locs["B"]) == 0


@pytest.mark.slow
async def test_disaster_recovery_of_a_wiped_location(
    dbs: dict[str, str], locs: dict[str, Location], spawn: Callable[[dict[str, Any]], EndpointProcess]
) -> None:
    configs = topology(dbs, {"A": "B", "B": "A"})
    eps = {n: spawn(c) for n, c in configs.items()}
    for ep in eps.values():
        ep.start()
    for i in range(5):
        await locs["A"].journal.persist(f"{LOG}|a{i}", [{"v": i}, {"v": i + 10}])
    await locs["B"].journal.persist(f"{LOG}|b", [{"v": "b"}])
    await stored(locs["A"], 11)
    await stored(locs["B"], 11)

    eps["A"].stop()
    await truncate_all(dbs["A"])  # the disaster: A's database is lost ...
    assert await locs["A"].journal.highest_seq_nr(f"{LOG}|a0") == 0
    # ... but snapshots survive from a backup: a0's is valid once recovered, a1's covers lost events
    await locs["A"].journal.save_snapshot(f"{LOG}|a0", 2, {"state": "valid"})
    await locs["A"].journal.save_snapshot(f"{LOG}|a1", 9, {"state": "covers events nobody has"})
    # while B is away, a recovery cannot finish: the process says so and exits, local writes stay refused
    eps["B"].stop()
    eps["A"].start("--recover")
    assert eps["A"].proc is not None
    assert await asyncio.to_thread(eps["A"].proc.wait, 120) == 1
    assert "recovery failed" in eps["A"].log() and "local writes stay refused" in eps["A"].log()
    with pytest.raises(LocalWritesRefused):
        await locs["A"].journal.persist(f"{LOG}|early", [{"v": "before recovery"}])
    assert await locs["A"].journal.highest_seq_nr(f"{LOG}|early") == 0
    eps["B"].start()
    await eps["B"].wait_ready()
    eps["A"].start("--recover")
    await wait_until(lambda: "recovered" in eps["A"].log(), 120, "A to say it recovered", every=0.2)
    assert f"endpoint A recovered {{'{LOG}': " in eps["A"].log()
    await eps["A"].wait_ready()
    assert await count(locs["A"]) == 11  # everything back when recovery says it is done
    assert await locs["A"].journal.highest_seq_nr(f"{LOG}|a1") == 2
    assert await locs["A"].journal.load_snapshot(f"{LOG}|a0") is not None
    assert await locs["A"].journal.load_snapshot(f"{LOG}|a1") is None  # invalid: deleted
    await locs["A"].journal.persist(f"{LOG}|new", [{"v": "after recovery"}])
    await stored(locs["B"], 12)  # B does not skip it, although it had read A's old log that far
    await stored(locs["A"], 12)
    for loc in (locs["A"], locs["B"]):
        assert set((await loc.store.event_ids(LOG)).values()) == {1}


@pytest.mark.slow
async def test_deletion_is_logical_first_and_physical_once_replicated(
    dbs: dict[str, str], locs: dict[str, Location], spawn: Callable[[dict[str, Any]], EndpointProcess]
) -> None:
    configs = topology(dbs, {"A": "", "B": "A"})
    a = spawn(configs["A"])
    a.start()
    await a.wait_ready()
    for i in range(4):
        await locs["A"].journal.persist(f"{LOG}|d", [{"v": i}])

    async def stamped() -> bool:  # A's endpoint has given them their log positions
        return int((await status(a))["logs"][LOG]["log_seq_nr"]) == 4

    await wait_until(stamped, 120, "A's endpoint to stamp the events", every=0.2)

    def delete(*more: str) -> dict[str, Any]:
        out = cli("endpoint", "delete", "--config", str(a.path), "--log", LOG, *more)
        assert out.returncode == 0, out.stderr
        result: dict[str, Any] = json.loads(out.stdout)
        return result

    bad = cli("endpoint", "delete", "--config", str(a.path), "--log", "Nope", "--to", "1")
    assert bad.returncode == 2 and "not one of this endpoint's logs" in bad.stderr
    got = await asyncio.to_thread(delete, "--to", "100", "--physically-after", "B")
    assert got == {"log": LOG, "logically_deleted_to": 4, "physically_deleted_to": 0}  # B has read nothing
    assert await local_reads(locs["A"]) == []  # logically deleted: local reads skip them
    events, _ = await locs["A"].store.read_log(LOG, 0, 10)
    assert len(events) == 4  # still there, for B

    b = spawn(configs["B"])
    b.start()
    await stored(locs["B"], 4)  # deleted at A, still replicated

    async def a_knows_b_stored_all() -> bool:  # B's next read tells A what it has stored
        return int((await locs["A"].store.target_progress(LOG)).get("B", 0)) >= 4

    await wait_until(a_knows_b_stored_all, 60, "A to learn that B stored everything", every=0.1)
    got = await asyncio.to_thread(delete, "--to", "4", "--physically-after", "B")
    assert got == {"log": LOG, "logically_deleted_to": 4, "physically_deleted_to": 4}
    events, _ = await locs["A"].store.read_log(LOG, 0, 10)
    assert len(events) == 1  # the pid's highest event stays (its tombstone keeps the seq_nr)
    assert await locs["A"].journal.highest_seq_nr(f"{LOG}|d") == 4
    assert sorted(e["v"] for e in await local_reads(locs["B"])) == [0, 1, 2, 3]  # B's copies untouched
