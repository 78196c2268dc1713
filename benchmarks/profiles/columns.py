"""What sending a column of 1000 elements costs the client and the server: asyncpg's array
encoder (a list or a tuple) against one text (JSON, read by PostgreSQL's array input or
``json_array_elements_text``) and the payloads as one bytea cut by ``substring``. Each case is a
prepared statement run 50 times per round; client CPU is ``process_time`` (median of the
rounds), server CPU the backend's (psutil, mean: its clock ticks are 10 ms), both over the empty
statement's. Run: ``flock /tmp/sj-bench.lock env PYTHONPATH=. .venv/bin/python
benchmarks/profiles/columns.py 10``."""

import os
import statistics
import sys
import time
from itertools import accumulate

import asyncpg
import orjson
import psutil

from benchmarks._common import fresh_database
from benchmarks.write_throughput import payload
from journal import runtime, slice_for

N = 1000
pids = [f"w|{e}" for e in range(N)]
slices = [slice_for(p) for p in pids]
pays = [orjson.dumps(payload(i)) for i in range(N)]
INTS = "translate($1::text, '[]', '{}')::int[]"
CUT = "substring($1::bytea FROM e - l + 1 FOR l)"
CASES = {
    "empty": ("SELECT 1", lambda: ()),
    "int[] list": ("SELECT count(*) FROM unnest($1::int[])", lambda: (slices,)),
    "int[] tuple": ("SELECT count(*) FROM unnest($1::int[])", lambda: (tuple(slices),)),
    "int[] as JSON text": (f"SELECT count(*) FROM unnest({INTS})", lambda: (orjson.dumps(slices).decode(),)),
    "text[] list": ("SELECT count(*) FROM unnest($1::text[])", lambda: (pids,)),
    "text[] as JSON text": (
        "SELECT count(*) FROM json_array_elements_text($1::json)",
        lambda: (orjson.dumps(pids).decode(),),
    ),
    "bytea[] list": ("SELECT count(*) FROM unnest($1::bytea[])", lambda: (pays,)),
    "bytea joined, ends, lengths": (
        f"SELECT count({CUT}) FROM ROWS FROM (unnest({INTS.replace('$1', '$2')}), unnest({INTS.replace('$1', '$3')}))"
        " AS t(e, l)",
        lambda: (
            b"".join(pays),
            orjson.dumps(list(accumulate(lengths := list(map(len, pays))))).decode(),
            orjson.dumps(lengths).decode(),
        ),
    ),
}


async def main(dsn: str, rounds: int) -> None:
    conn = await asyncpg.connect(dsn)
    backend = psutil.Process(conn.get_server_pid())
    client: dict[str, list[float]] = {k: [] for k in CASES}
    server: dict[str, list[float]] = {k: [] for k in CASES}
    for sql, args in CASES.values():
        await conn.fetchval(sql, *args())
    for _ in range(rounds):
        for k, (sql, args) in CASES.items():
            s0 = sum(backend.cpu_times()[:2])
            t = time.process_time()
            for _ in range(50):
                await conn.fetchval(sql, *args())
            client[k].append((time.process_time() - t) / 50)
            server[k].append((sum(backend.cpu_times()[:2]) - s0) / 50)
    await conn.close()
    c0, s0 = statistics.median(client["empty"]), statistics.mean(server["empty"])
    print(f"# load1 {os.getloadavg()[0]:.2f}; per 1000 elements, over the empty statement")
    for k in CASES:
        c, s = statistics.median(client[k]) - c0, statistics.mean(server[k]) - s0
        print(f"{k:<30} client {1e6 * c:6.0f} us   server {1e6 * s:6.0f} us")


with fresh_database() as dsn:
    runtime.run(main(dsn, int(sys.argv[1]) if len(sys.argv) > 1 else 10))
