import asyncio
import cProfile
import json
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.argv = [sys.argv[0]]
from benchmarks.replication_throughput import LOG, fill, free_address, ready
from journal import JournalSettings, open_journal
from journal.postgres.embedded import start_embedded
from journal.postgres.migrations import upgrade
from journal.postgres.replication_store import PostgresReplicationStore
from journal.replication.replicator import Replicator
from journal.replication.transport import RemoteSource
from tests.support.scratch import scratch_database

EVENTS = 20000


async def run(a, b, tmp):
    await fill(a, EVENTS)
    async with open_journal(a, settings=JournalSettings.load(dsn=a)) as ja:
        sa = PostgresReplicationStore(ja.backend, "A")
        await sa.ensure_log(LOG)
        while await sa.stamp(LOG, 5000) > 0:
            pass
    addr = free_address()
    cfg = tmp / "A.json"
    cfg.write_text(json.dumps({"location": "A", "dsn": a, "listen": addr, "logs": [LOG], "batch_size": 1000}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "journal", "endpoint", "run", "--config", str(cfg)], stderr=subprocess.DEVNULL
    )
    try:
        await ready(addr)
        async with open_journal(b, settings=JournalSettings.load(dsn=b)) as jb:
            sb = PostgresReplicationStore(jb.backend, "B")
            await sb.ensure_log(LOG)
            src = RemoteSource(addr, None)
            pr = cProfile.Profile()
            spent = {}

            def wrap(obj, name, label):
                f = getattr(obj, name)

                async def w(*a, **k):
                    t0 = time.perf_counter()
                    try:
                        return await f(*a, **k)
                    finally:
                        spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0

                setattr(obj, name, w)

            rep = Replicator(sb, src, LOG, batch_size=1000)
            for name in ("target_state", "missing_ids", "write_replicated"):
                wrap(sb, name, "B store." + name)
            wrap(rep, "_read", "read from A (gRPC, A's query, decode)")
            t = time.perf_counter()
            c = time.process_time()
            n = await rep.catch_up()
            total = time.perf_counter() - t
            for k, v in spent.items():
                print(f"  {k:<40} {v:.3f} s ({v / total:.0%})")
            print(
                f"replicated {n} in {time.perf_counter() - t:.2f} s wall, B client CPU {time.process_time() - c:.2f} s ({n / total:,.0f} ev/s)"
            )
            await src.close()

    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    for name in ():
        print(f"===== {name.upper()} side, by tottime")
        pstats.Stats(str(tmp / f"{name}.prof")).sort_stats("tottime").print_stats(18)


with tempfile.TemporaryDirectory() as d:
    tmp = Path(d)
    server = start_embedded(tmp / "pg")
    with scratch_database(server, "pra") as a, scratch_database(server, "prb") as b:
        upgrade(a)
        upgrade(b)
        asyncio.run(run(a, b, tmp))
