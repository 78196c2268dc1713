"""Disaster recovery while the lost location's application keeps writing (real processes).

Three locations in a full mesh, an endpoint process each, an application writing at each (this
test process, through the library). C's database is lost twice: its endpoint is killed (-9), its
database dropped and created again empty, ``journal migrate`` run, and C's application writes into
the new database before ``journal endpoint run --recover`` starts (the runbook followed as written,
with the application never stopped). Then, at every location: every identity
``(origin location, origin seq nr)`` names the same event, each stored once; every write
acknowledged by a database that was not lost afterwards is everywhere; every log holds each event
after everything its vector time says it depends on; and ``recovered {...}`` counts at least what
a peer held when the recovery started.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from endpoint_processes import JOURNAL_CLI, ROOT, EndpointProcess, free_address
from replication_helpers import location_databases

from journal import JournalSettings, open_journal
from journal.postgres.dsn import asyncpg_dsn
from tests.support.scratch import admin
from tests.support.waiting import wait_until

LOG = "Order"
NAMES = ["A", "B", "C"]
LOSSES = 2


@pytest.fixture(scope="module")
def dbs(server_dsn: str) -> Iterator[dict[str, str]]:
    with location_databases(server_dsn, NAMES) as d:
        yield d


class Writer:
    """One location's application: persists unique values until stopped, whatever fails."""

    def __init__(self, name: str, dsn: str) -> None:
        self.name = name
        self.dsn = dsn
        self.generation = 0
        """Which database of the location acknowledged a write (C's grows with each loss)."""
        self.acked: dict[str, int] = {}
        """Value -> generation of the database that acknowledged it."""
        self.failures = 0
        self._stop = asyncio.Event()

    async def run(self) -> None:
        settings = JournalSettings.load(env={}, dsn=self.dsn)
        async with open_journal(self.dsn, settings=settings, migrate=False) as j:
            i = 0
            while not self._stop.is_set():
                i += 1
                value = f"{self.name}.{self.generation}.{i}"
                generation = self.generation
                try:
                    await j.persist(f"{LOG}|{self.name.lower()}{i % 7}", [{"v": value}])
                except Exception:  # the database is gone, empty, recovering...: the application goes on
                    self.failures += 1
                else:
                    self.acked[value] = generation
                with contextlib.suppress(TimeoutError):  # a steady rate, not a busy loop
                    async with asyncio.timeout(0.01):
                        await self._stop.wait()

    def stop(self) -> None:
        self._stop.set()


async def fetch(dsn: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def log_rows(dsn: str) -> list[asyncpg.Record]:
    """The log in log order: identity, value, vector time (unstamped local events last, as None)."""
    return await fetch(
        dsn,
        "SELECT origin_location, origin_seq_nr, event_payload, vector_time, log_seq_nr FROM event_journal "
        "WHERE entity_type = $1 ORDER BY log_seq_nr NULLS LAST",
        LOG,
    )


def value_of(row: asyncpg.Record) -> str:
    return str(json.loads(bytes(row["event_payload"]))["v"])


async def ids(dsn: str) -> dict[tuple[str, int], list[str]]:
    out: dict[tuple[str, int], list[str]] = {}
    for r in await log_rows(dsn):
        if r["origin_location"] is not None:
            out.setdefault((r["origin_location"], r["origin_seq_nr"]), []).append(value_of(r))
    return out


async def lose(server: str, dsn: str) -> None:
    """The disaster: the location's database is gone (its connections with it)."""
    await admin(server, f'DROP DATABASE "{urlsplit(dsn).path.lstrip("/")}" WITH (FORCE)')


async def recreate(server: str, dsn: str) -> None:
    """The runbook's first steps: a new empty database, ``journal migrate``."""
    await admin(server, f'CREATE DATABASE "{urlsplit(dsn).path.lstrip("/")}"')
    out = await asyncio.to_thread(
        subprocess.run, [*JOURNAL_CLI, "migrate", "--dsn", dsn], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr


def causal_violations(rows: list[asyncpg.Record]) -> list[str]:
    """Events stored before an event their vector time covers (both present in this log)."""
    stamped = [r for r in rows if r["log_seq_nr"] is not None]
    seqs: dict[str, list[int]] = {}  # origin -> its origin seq nrs here, ascending
    latest: dict[str, list[int]] = {}  # origin -> the greatest log index among seqs[:k + 1]
    for i, r in sorted(enumerate(stamped), key=lambda x: (x[1]["origin_location"], x[1]["origin_seq_nr"])):
        seqs.setdefault(r["origin_location"], []).append(r["origin_seq_nr"])
        prior = latest.setdefault(r["origin_location"], [])
        prior.append(max(i, prior[-1]) if prior else i)
    bad = []
    for i, r in enumerate(stamped):
        vt = json.loads(r["vector_time"]) if isinstance(r["vector_time"], str) else r["vector_time"]
        for origin, upto in vt.items():
            k = bisect.bisect_right(seqs.get(origin, []), upto)
            if k and latest[origin][k - 1] > i:
                me = (r["origin_location"], r["origin_seq_nr"])
                bad.append(f"{me} {vt} stored before one of ({origin}, <={upto})")
    return bad


def recovered_counts(log: str) -> list[int]:
    return [int(n) for n in re.findall(rf"recovered {{'{LOG}': (\d+)}}", log)]


@pytest.mark.slow
async def test_lost_location_recovers_while_its_application_keeps_writing(
    server_dsn: str, dbs: dict[str, str], tmp_path: Path
) -> None:
    addresses = {n: free_address() for n in NAMES}
    configs = {
        n: {
            "location": n, "dsn": dbs[n], "listen": addresses[n], "logs": [LOG], "retry_delay": 0.3,
            "failure_detection_limit": 3.0, "batch_size": 50,
            "connections": [{"address": addresses[m]} for m in NAMES if m != n],
        }
        for n in NAMES
    }  # fmt: skip
    eps = {n: EndpointProcess(tmp_path, c) for n, c in configs.items()}
    writers = {n: Writer(n, dbs[n]) for n in NAMES}
    tasks = [asyncio.create_task(w.run()) for w in writers.values()]
    try:
        for ep in eps.values():
            ep.start()
        for ep in eps.values():
            await ep.wait_ready()
        peer_held: list[int] = []
        for loss in range(1, LOSSES + 1):

            async def c_events_at_a() -> bool:
                return sum(1 for o, _ in await ids(dbs["A"]) if o == "C") >= 30

            await wait_until(c_events_at_a, 120, "C's events to reach A", every=0.2)
            eps["C"].kill9()
            await lose(server_dsn, dbs["C"])
            writers["C"].generation = loss  # from now on, a write acknowledged is in the new database
            await recreate(server_dsn, dbs["C"])

            async def written_into_the_new_database(loss: int = loss) -> bool:  # the runbook's window
                return sum(1 for g in writers["C"].acked.values() if g == loss) >= 10

            await wait_until(written_into_the_new_database, 60, "C's application to write again", every=0.05)
            peer_held.append(len(await ids(dbs["A"])))
            eps["C"].start("--recover")
            await wait_until(lambda n=loss: len(recovered_counts(eps["C"].log())) >= n, 120, "C to recover", every=0.1)
            await eps["C"].wait_ready()
        await wait_until(
            lambda: sum(1 for g in writers["C"].acked.values() if g == LOSSES) >= 60, 60, "writes after recovery"
        )
    finally:
        for w in writers.values():
            w.stop()
        await asyncio.gather(*tasks)

    async def converged() -> bool:
        unstamped = await fetch(dbs["C"], "SELECT 1 FROM event_journal WHERE log_seq_nr IS NULL LIMIT 1")
        found = [set(await ids(dbs[n])) for n in NAMES]
        return not unstamped and found[0] == found[1] == found[2]

    try:
        await wait_until(converged, 90, "the three locations to converge", every=0.5)
    except AssertionError:
        found = {n: set(await ids(dbs[n])) for n in NAMES}
        unstamped = await fetch(dbs["C"], "SELECT count(*) FROM event_journal WHERE log_seq_nr IS NULL")
        apart = {n: (len(found[n]), sorted(found[n] ^ found["A"])[:5]) for n in NAMES}
        raise AssertionError(f"no convergence: {unstamped[0][0]} unstamped at C; sizes, differences: {apart}") from None
    finally:
        for ep in eps.values():
            ep.stop()

    stored = {n: await ids(dbs[n]) for n in NAMES}
    for n in NAMES:
        twice = {i: v for i, v in stored[n].items() if len(v) > 1}
        assert not twice, f"{n} stores identities twice: {list(twice.items())[:5]}"
    differ = {i: [stored[n][i][0] for n in NAMES] for i in stored["A"] if len({stored[n][i][0] for n in NAMES}) > 1}
    assert not differ, f"{len(differ)} identities name different events, e.g. {list(differ.items())[:5]}"

    values = {n: {v[0] for v in stored[n].values()} for n in NAMES}
    assert values["A"] == values["B"] == values["C"]
    for name, w in writers.items():
        lost_with_a_database = {v for v, g in w.acked.items() if name == "C" and g < LOSSES}
        missing = set(w.acked) - values["A"] - lost_with_a_database
        assert not missing, f"{len(missing)} acknowledged writes of {name} are missing, e.g. {sorted(missing)[:5]}"
    assert sum(1 for v, g in writers["C"].acked.items() if g > 0 and v in values["A"]) >= 60

    for n in NAMES:
        bad = causal_violations(await log_rows(dbs[n]))
        assert not bad, f"{n} stores {len(bad)} events before their causes, e.g. {bad[:3]}"

    counts = recovered_counts(eps["C"].log())
    assert len(counts) == LOSSES
    for held, n in zip(peer_held, counts, strict=True):
        assert n >= held, f"recovered {n} events, but A held {held} when the recovery started"
