"""Replication throughput and latency between two locations (issue 14), beside the local slice
read rate measured in the same run.

Two databases on one server (location A = source, B = target). A is filled with N events; then:
(b) stamping: A's endpoint giving the N local events their log position and vector time (once);
then ``--rounds`` paired rounds, their order rotated each round (benchmarks._common.alternate):
(a) local: ``current_events_by_slices`` over all slices at A (the ceiling: what A can read);
(c) replication: a fresh B (one database per round) pulls all N from A's endpoint process over
    gRPC, in batches, into its journal (events, vector check, progress in one transaction per
    batch) - events/s end to end; the ratio is the median of the rounds' ratios; with the CPU
    per 1000 events of B's process, of A's endpoint process and of the server (both databases);
(r) B's ceiling: the same rows (read from A beforehand) written into a fresh database with a raw
    ``unnest`` INSERT of every column replication writes, one transaction per batch, nothing
    else (no read, no decoding, no vector check, no progress): what B's table alone takes;
    beside it the same rows by COPY (asyncpg ``copy_records_to_table``, binary), each into a fresh
    database, one transaction per batch: (r2) straight into event_journal (the timestamps made by
    the client), (r3) into a temporary staging table, then one ``INSERT ... SELECT`` from it (the
    shape a journal statement needing the server's clock and the pids' newest rows would take);
    the best of the three against the local read is printed as "B's best write / read": if it is
    below 0.5, no write of B's rows reaches the goal on this machine;
(d) latency: endpoints A and B as processes with update notifications on; single events written
    at A one at a time (each once B's live slice query delivered the previous, then 50 ms pause),
    timed until stored at B (polled by primary key, an index lookup) and until B's live slice
    query delivers them (p50/p99).

    flock /tmp/sj-bench.lock python benchmarks/replication_throughput.py [--events 50000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from journal import Journal, JournalSettings, open_journal, runtime, slice_for
from journal.postgres.backend import PostgresBackend
from journal.postgres.migrations import upgrade
from journal.postgres.replication_sql import dump_vt
from journal.postgres.replication_store import PostgresReplicationStore
from journal.replicated import ReplicatedEvent
from journal.replication.replicator import Replicator
from journal.replication.transport import RemoteSource
from tests.support.scratch import scratch_database

try:
    from benchmarks._common import CpuMeter, _stat, alternate_async, header
except ImportError:  # run as a script from benchmarks/
    from _common import CpuMeter, _stat, alternate_async, header  # type: ignore[no-redef]

LOG = "bench"
ENTITIES = 1000
FILL = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
  event_ser_manifest, event_payload, writer)
SELECT s, 'bench', p, n, now() - interval '1 hour' + i * interval '1 microsecond', 1, '', b, 'w'
FROM unnest($1::int[], $2::text[], $3::bigint[], $4::bytea[], $5::bigint[]) AS t(s, p, n, b, i)"""
CLI = [sys.executable, "-c", "from journal.cli import main; main()"]
RAW = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
  event_ser_manifest, event_payload, deleted, writer, origin_location, origin_seq_nr, vector_time, log_seq_nr)
SELECT s, $1, p, n, clock_timestamp(), i, m, b, false, 'w', o, os, vt::jsonb, ls
FROM unnest($2::int[], $3::text[], $4::bigint[], $5::int[], $6::text[], $7::bytea[], $8::text[], $9::bigint[],
            $10::text[], $11::bigint[]) AS t(s, p, n, i, m, b, o, os, vt, ls)"""


COPY_COLUMNS = (
    "slice", "entity_type", "persistence_id", "seq_nr", "db_timestamp", "event_ser_id", "event_ser_manifest",
    "event_payload", "deleted", "writer", "origin_location", "origin_seq_nr", "vector_time", "log_seq_nr",
)  # fmt: skip
STAGE = """
CREATE TEMPORARY TABLE sj_stage (s int, p text, n bigint, i int, m text, b bytea, o text, os bigint, vt text,
  ls bigint) ON COMMIT DELETE ROWS"""
FROM_STAGE = """
INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
  event_ser_manifest, event_payload, deleted, writer, origin_location, origin_seq_nr, vector_time, log_seq_nr)
SELECT s, $1, p, n, clock_timestamp(), i, m, b, false, 'w', o, os, vt::jsonb, ls FROM sj_stage"""


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


async def fill(dsn: str, events: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for start in range(0, events, 20_000):
            idx = range(start, min(events, start + 20_000))
            await conn.execute(
                FILL,
                [slice_for(f"bench|{i % ENTITIES}") for i in idx],
                [f"bench|{i % ENTITIES}" for i in idx],
                [i // ENTITIES + 1 for i in idx],
                [json.dumps({"item": f"sku-{i % 977}", "qty": i % 7 + 1}).encode() for i in idx],
                list(idx),
            )
        await conn.execute("VACUUM ANALYZE event_journal")
    finally:
        await conn.close()


@contextlib.contextmanager
def endpoint(tmp: Path, config: dict[str, object]) -> Iterator[subprocess.Popen[bytes]]:
    path = tmp / f"{config['location']}.json"
    path.write_text(json.dumps(config))
    proc = subprocess.Popen([*CLI, "endpoint", "run", "--config", str(path)], stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def ready(address: str) -> None:
    for _ in range(600):
        source = RemoteSource(address, None, timeout=2.0)
        try:
            await source.info()
            return
        except Exception:
            await asyncio.sleep(0.1)
        finally:
            await source.close()
    raise RuntimeError(f"endpoint {address} did not start")


class SideCpu:
    """CPU per 1000 events of a ceiling side's rounds (and the local read's): this process's and
    the server's (every process of it), medians over the rounds."""

    def __init__(self) -> None:
        self.rounds: dict[str, list[tuple[float, float | None]]] = {}

    def add(self, side: str, meter: CpuMeter, events: int) -> None:
        per = 1e6 / events
        server = None if meter.server is None else meter.server * per
        self.rounds.setdefault(side, []).append((meter.client * per, server))

    def line(self, side: str) -> str:
        got = self.rounds.get(side, [])
        client = statistics.median(r[0] for r in got) if got else float("nan")
        servers = [r[1] for r in got if r[1] is not None]
        server = f"{statistics.median(servers):.2f} ms" if servers else "n/a"
        return f"CPU per 1000 events (medians): client {client:.2f} ms, server {server}"


SPENT = SideCpu()


async def local_read(ja: Journal, side: str | None = None) -> float:
    async with ja.backend.pool.acquire() as conn:  # type: ignore[attr-defined]
        meter = CpuMeter(conn.get_server_pid())
    meter.start()
    t = time.perf_counter()
    n = 0
    async for _ in ja.current_events_by_slices(LOG, 0, 1023):
        n += 1
    rate = n / (time.perf_counter() - t)
    meter.stop()
    if side is not None:
        SPENT.add(side, meter, n)
    return rate


async def replicate(target: str, address_a: str, batch: int, events: int, cpu: Cpu) -> float:
    """B (a fresh database) pulls every event of A's log over gRPC."""
    async with open_journal(target, settings=JournalSettings.load(dsn=target)) as jb:
        assert isinstance(jb.backend, PostgresBackend)
        store_b = PostgresReplicationStore(jb.backend, "B")
        await store_b.ensure_log(LOG)
        async with jb.backend.pool.acquire() as conn:
            meter = CpuMeter(conn.get_server_pid())
        source = RemoteSource(address_a, None)
        try:
            replicator = Replicator(store_b, source, LOG, batch_size=batch)
            a0 = _stat(cpu.endpoint_pid)
            meter.start()
            t = time.perf_counter()
            written = await replicator.catch_up()
            rate = written / (time.perf_counter() - t)
            meter.stop()
            a1 = _stat(cpu.endpoint_pid)
        finally:
            await source.close()
    assert written == events, (written, events)
    cpu.add(meter, None if a0 is None or a1 is None else a1[1] - a0[1], events)
    return rate


class Cpu:
    """CPU per 1000 events of the replication rounds: B's process, A's endpoint, the server."""

    def __init__(self) -> None:
        self.endpoint_pid = 0
        self.rounds: list[tuple[float, float | None, float | None]] = []

    def add(self, meter: CpuMeter, endpoint: float | None, events: int) -> None:
        per = 1e6 / events
        self.rounds.append((
            meter.client * per, None if meter.server is None else meter.server * per,
            None if endpoint is None else endpoint * per,
        ))  # fmt: skip

    def line(self) -> str:
        def med(i: int) -> str:
            got = [r[i] for r in self.rounds if r[i] is not None]
            return f"{statistics.median(got):.2f} ms" if got else "n/a"  # type: ignore[type-var]

        return f"B's process {med(0)}, A's endpoint process {med(2)}, server (A and B) {med(1)}"


async def stamp_all(store: PostgresReplicationStore) -> int:
    """Stamp every event of A's log (as the endpoint's stamp loop would); how many."""
    stamped = 0
    while (k := await store.stamp(LOG, 5000)) > 0:
        stamped += k
    return stamped


async def read_all(store: PostgresReplicationStore, batch: int) -> list[list[ReplicatedEvent]]:
    """A's log in batches, as the endpoint reads it (for B's ceiling)."""
    out: list[list[ReplicatedEvent]] = []
    after = 0
    while True:
        events, after = await store.read_log(LOG, after, batch)
        if not events:
            return out
        out.append(events)


def _raw_params(b: list[ReplicatedEvent]) -> tuple[object, ...]:
    return (
        LOG, [slice_for(e.persistence_id) for e in b], [e.persistence_id for e in b],
        [e.origin_seq_nr for e in b], [e.event.ser_id for e in b], [e.event.manifest for e in b],
        [e.event.payload for e in b], [e.origin_location for e in b], [e.origin_seq_nr for e in b],
        [dump_vt(e.vector_time) for e in b], [e.log_seq_nr for e in b],
    )  # fmt: skip


def metered(side: str, meter: CpuMeter, batches: list[list[ReplicatedEvent]], seconds: float) -> float:
    """The side's rate; its CPU (``meter``, running since the clock started) recorded in :data:`SPENT`."""
    meter.stop()
    events = sum(len(b) for b in batches)
    SPENT.add(side, meter, events)
    return events / seconds


async def raw_write(target: str, batches: list[list[ReplicatedEvent]]) -> float:
    """B's ceiling: the rows alone, a raw INSERT per batch in its own transaction (parameters
    built before the clock starts)."""
    params = [_raw_params(b) for b in batches]
    conn = await asyncpg.connect(target)
    try:
        meter = CpuMeter(conn.get_server_pid())
        meter.start()
        t = time.perf_counter()
        for p in params:
            async with conn.transaction():
                await conn.execute(RAW, *p)
        return metered("raw-insert", meter, batches, time.perf_counter() - t)
    finally:
        await conn.close()


def _copy_records(b: list[ReplicatedEvent], base: datetime) -> list[tuple[object, ...]]:
    return [
        (slice_for(e.persistence_id), LOG, e.persistence_id, e.origin_seq_nr, base + timedelta(microseconds=k),
         e.event.ser_id, e.event.manifest, e.event.payload, False, "w", e.origin_location, e.origin_seq_nr,
         dump_vt(e.vector_time), e.log_seq_nr)
        for k, e in enumerate(b)
    ]  # fmt: skip


async def copy_write(target: str, batches: list[list[ReplicatedEvent]]) -> float:
    """B's ceiling by COPY: the rows straight into event_journal, one COPY per batch in its own
    transaction (records built before the clock, timestamps by the client)."""
    base = datetime.now(UTC) - timedelta(hours=1)
    records = [_copy_records(b, base + timedelta(seconds=k)) for k, b in enumerate(batches)]
    conn = await asyncpg.connect(target)
    try:
        meter = CpuMeter(conn.get_server_pid())
        meter.start()
        t = time.perf_counter()
        for r in records:
            async with conn.transaction():
                await conn.copy_records_to_table("event_journal", records=r, columns=COPY_COLUMNS)
        return metered("copy", meter, batches, time.perf_counter() - t)
    finally:
        await conn.close()


async def staged_write(target: str, batches: list[list[ReplicatedEvent]]) -> float:
    """B's ceiling by COPY into a temporary staging table, then one INSERT ... SELECT per batch,
    both in the batch's transaction (records built and the staging table made before the clock)."""
    records = [
        [(slice_for(e.persistence_id), e.persistence_id, e.origin_seq_nr, e.event.ser_id, e.event.manifest,
          e.event.payload, e.origin_location, e.origin_seq_nr, dump_vt(e.vector_time), e.log_seq_nr) for e in b]
        for b in batches
    ]  # fmt: skip
    conn = await asyncpg.connect(target)
    try:
        await conn.execute(STAGE)
        meter = CpuMeter(conn.get_server_pid())
        meter.start()
        t = time.perf_counter()
        for r in records:
            async with conn.transaction():
                await conn.copy_records_to_table("sj_stage", records=r)
                await conn.execute(FROM_STAGE, LOG)
        return metered("copy-staged", meter, batches, time.perf_counter() - t)
    finally:
        await conn.close()


async def run(
    a: str, bs: list[str], rs: dict[str, list[str]], events: int, batch: int, latency_events: int, tmp: Path
) -> None:
    await fill(a, events)
    s_a = JournalSettings.load(dsn=a)
    async with open_journal(a, settings=s_a) as ja:
        assert isinstance(ja.backend, PostgresBackend)
        store_a = PostgresReplicationStore(ja.backend, "A")
        await store_a.ensure_log(LOG)
        await local_read(ja)  # untimed: A's cache warm for both sides

        t = time.perf_counter()
        stamp_rate = await stamp_all(store_a) / (time.perf_counter() - t)

        batches = await read_all(store_a, batch)
        address_a = free_address()
        cfg_a = {"location": "A", "dsn": a, "listen": address_a, "logs": [LOG], "batch_size": batch}
        cpu = Cpu()
        with endpoint(tmp, cfg_a) as proc:
            cpu.endpoint_pid = proc.pid
            await ready(address_a)
            rounds = await alternate_async(len(bs) - 1, {
                "local": lambda k: local_read(ja, "local"),
                "replication": lambda k: replicate(bs[k + 1], address_a, batch, events, cpu),
                "raw-insert": lambda k: raw_write(rs["raw"][k], batches),
                "copy": lambda k: copy_write(rs["copy"][k], batches),
                "copy-staged": lambda k: staged_write(rs["staged"][k], batches),
            })  # fmt: skip
        rounds.report(f"replication A->B over gRPC, batch {batch}", "replication", "local", "ev/s", target=0.5)
        print(f"    CPU per 1000 events replicated (medians): {cpu.line()}")
        print(f"    local read: {SPENT.line('local')}")
        rounds.report("B's ceiling: raw INSERT of the same rows", "raw-insert", "local", "ev/s")
        print(f"    {SPENT.line('raw-insert')}")
        print(f"    replication / raw INSERT: {rounds.ratio('replication', 'raw-insert'):.2f} "
              f"(rounds {' '.join(f'{r:.2f}' for r in rounds.ratios('replication', 'raw-insert'))})")  # fmt: skip
        rounds.report("B's ceiling: COPY into event_journal", "copy", "local", "ev/s")
        print(f"    {SPENT.line('copy')}")
        rounds.report("B's ceiling: COPY to staging + INSERT SELECT", "copy-staged", "local", "ev/s")
        print(f"    {SPENT.line('copy-staged')}")
        best = max(("raw-insert", "copy", "copy-staged"), key=lambda side: rounds.ratio(side, "local"))
        verdict = "reachable" if rounds.ratio(best, "local") >= 0.5 else "0.5 NOT reachable by any write of B's rows"
        name = "B's best write / local read"
        print(f"{name:<44} {best} ratio {rounds.ratio(best, 'local'):.2f}: {verdict}")
        print(f"    replication / {best}: {rounds.ratio('replication', best):.2f}")
        print(f"{'stamping local events at A (once per event)':<44} {stamp_rate:,.0f} events/s")
    b = bs[0]
    s_b = JournalSettings.load(dsn=b)

    # latency with update notifications: both endpoints as processes
    address_a, address_b = free_address(), free_address()
    common = {"logs": [LOG], "retry_delay": 5.0, "update_notifications": True}
    cfg_a = {"location": "A", "dsn": a, "listen": address_a, **common}
    cfg_b = {"location": "B", "dsn": b, "listen": address_b, "connections": [{"address": address_a}], **common}
    with endpoint(tmp, cfg_a), endpoint(tmp, cfg_b):
        await ready(address_a)
        await ready(address_b)
        async with open_journal(a, settings=s_a) as ja, open_journal(b, settings=s_b) as jb:
            sent: dict[str, float] = {}
            latencies: list[float] = []
            stored: list[float] = []
            conn_b = await asyncpg.connect(b)
            done = asyncio.Event()
            delivered = asyncio.Event()

            async def follow() -> None:
                async for env in jb.events_by_slices(LOG, 0, 1023):
                    key = env.event.get("lat") if isinstance(env.event, dict) else None
                    if key in sent:
                        latencies.append(time.perf_counter() - sent.pop(key))
                        delivered.set()
                        if len(latencies) == latency_events:
                            done.set()

            follower = asyncio.create_task(follow())
            # warm up: one event end to end (the Watch stream and the follower are connected)
            sent["warm-up"] = time.perf_counter()
            await ja.persist(f"{LOG}|warm", [{"lat": "warm-up"}])
            async with asyncio.timeout(120):
                await delivered.wait()
            latencies.clear()
            # stored at B: polled by primary key (one index lookup), not a scan of B's table
            stored_q = "SELECT 1 FROM event_journal WHERE persistence_id = $1 AND seq_nr = 1"
            for i in range(latency_events):
                key = f"l{i}"
                delivered.clear()
                sent[key] = time.perf_counter()
                t0 = sent[key]
                await ja.persist(f"{LOG}|lat{i}", [{"lat": key}])
                while not await conn_b.fetchval(stored_q, f"{LOG}|lat{i}"):  # noqa: ASYNC110 (the measurement)
                    await asyncio.sleep(0.002)
                stored.append(time.perf_counter() - t0)
                async with asyncio.timeout(120):
                    await delivered.wait()
                await asyncio.sleep(0.05)
            try:
                await asyncio.wait_for(done.wait(), 120)
            finally:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follower
                await conn_b.close()
    stored.sort()
    print(f"latency to stored at B (polled every 2 ms): p50 {statistics.median(stored) * 1000:.1f} ms  "
          f"max {stored[-1] * 1000:.1f} ms")  # fmt: skip
    latencies.sort()
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000
    print(f"latency to delivered by B's live slice query ({len(latencies)} events): "
          f"p50 {p50:.1f} ms  p99 {p99:.1f} ms")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=50_000)
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--latency-events", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3, help="paired rounds of local read and replication")
    args = p.parse_args()
    header(f"replication throughput: {args.events} events, batch {args.batch_size}; event loop {runtime.loop_name()}")
    with contextlib.ExitStack() as stack:
        server = os.environ.get("JOURNAL_DSN")
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sj-bench-repl-")))
        if not server:
            from journal.postgres.embedded import start_embedded

            server = start_embedded(tmp / "pgdata")
        a = stack.enter_context(scratch_database(server, "sjbencha"))
        bs = [stack.enter_context(scratch_database(server, f"sjbenchb{k}")) for k in range(args.rounds + 1)]
        rs = {
            side: [stack.enter_context(scratch_database(server, f"sjbench{side}{k}")) for k in range(args.rounds)]
            for side in ("raw", "copy", "staged")
        }
        for dsn in (a, *bs, *(d for ds in rs.values() for d in ds)):
            upgrade(dsn)
        # the runtime an endpoint runs on (`journal endpoint run`: uvloop, the tuned collector), for
        # B here and the local read alike
        runtime.run(run(a, bs, rs, args.events, args.batch_size, args.latency_events, tmp))


if __name__ == "__main__":
    main()
