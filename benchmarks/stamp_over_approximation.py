"""How often a local event's vector time covers a remote event that arrived after it was written.

Two locations replicating both ways (two endpoints in this process, their own databases), an
application writing at each for ``--seconds``. Then, at A: a local event e is *over-approximated*
when its vector time's entry for B reaches a B event that A stored after e was written (that
B event's ``db_timestamp`` at A is later than e's): e's writer cannot have seen it, yet a
replicated entity orders the two instead of seeing them concurrent. Prints the share of such
events and the gaps.

    flock /tmp/sj-bench.lock python benchmarks/stamp_over_approximation.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import asyncpg

from journal.postgres.dsn import asyncpg_dsn
from journal.replication.config import EndpointConfig
from journal.replication.endpoint import ReplicationEndpoint
from tests.endpoint_processes import free_address

try:
    from benchmarks._common import fresh_databases
except ImportError:  # run as a script from benchmarks/
    from _common import fresh_databases  # type: ignore[no-redef]

LOG = "Order"


async def writer(ep: ReplicationEndpoint, name: str, until: float) -> int:
    n = 0
    while time.monotonic() < until:
        await asyncio.gather(*(ep.journal.persist(f"{LOG}|{name}{n % 7}-{k}", [{"v": n}]) for k in range(3)))
        n += 1
        await asyncio.sleep(0.005)
    return n * 3


async def measure(dsn: str) -> list[float]:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        rows = await conn.fetch(
            "SELECT origin_location, origin_seq_nr, vector_time, db_timestamp FROM event_journal "
            "WHERE entity_type = $1 AND log_seq_nr IS NOT NULL",
            LOG,
        )
    finally:
        await conn.close()
    arrived = {r["origin_seq_nr"]: r["db_timestamp"] for r in rows if r["origin_location"] == "B"}
    gaps = []
    for r in rows:
        if r["origin_location"] != "A":
            continue
        vt = json.loads(r["vector_time"]) if isinstance(r["vector_time"], str) else r["vector_time"]
        covered = arrived.get(vt.get("B", 0))
        gaps.append((covered - r["db_timestamp"]).total_seconds() if covered and covered > r["db_timestamp"] else 0.0)
    return gaps


async def run(dsns: dict[str, str], seconds: float) -> None:
    address = {n: free_address() for n in dsns}

    def endpoint(me: str, peer: str) -> ReplicationEndpoint:
        return ReplicationEndpoint(EndpointConfig.from_dict({
            "location": me, "dsn": dsns[me], "listen": address[me], "logs": [LOG],
            "connections": [{"address": address[peer]}], "retry_delay": 0.2,
        }))  # fmt: skip

    async with endpoint("A", "B") as a, endpoint("B", "A") as b:
        until = time.monotonic() + seconds
        written = await asyncio.gather(writer(a, "a", until), writer(b, "b", until))
        async with asyncio.timeout(120):
            while min([len(await ep.store.event_ids(LOG)) for ep in (a, b)]) < sum(written):  # noqa: ASYNC110
                await asyncio.sleep(0.2)
    gaps = await measure(dsns["A"])
    over = sorted(g for g in gaps if g > 0)
    print(f"local events at A: {len(gaps)}; over-approximated: {len(over)} ({100 * len(over) / len(gaps):.1f}%)")
    if over:
        print(f"gap median {1000 * statistics.median(over):.1f} ms, max {1000 * over[-1]:.1f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args()
    with fresh_databases(["A", "B"]) as dsns:
        asyncio.run(run(dsns, args.seconds))


if __name__ == "__main__":
    main()
