"""Events out to Kafka: the KafkaPublisher projection (exactly-once, then at-least-once) beside a
bare confluent-kafka producer sending the same records (same keys, values, headers, built by the
same RecordBuilder; idempotent, no transactions, one flush at the end), beside a bare
transactional producer sending them in transactions of the publisher's batch size (what Kafka's
transactions cost alone), and beside the same workers with a handler that does nothing (what
reading the journal costs), in the same run. Usage:
    [JOURNAL_DSN=postgresql://...] [KAFKA_BOOTSTRAP_SERVERS=host:port] \\
        python benchmarks/kafka_publish.py [--events N] [--processes P] [--workers K] [--rounds R]
(default 200,000 events, 5 rounds, the batch and page sizes `projections run --to-kafka` uses by
default, group_size 5000 (projections.kafka.GROUP_SIZE) and buffer_size 1000; tuned:
`--group-size 20000`; a fresh database on JOURNAL_DSN's server, else an embedded server; a local
KRaft broker started from the Maven Central jars unless KAFKA_BOOTSTRAP_SERVERS is set, its logs on
a RAM disk, /dev/shm, when it has 8 GiB free (`--broker-on-disk`: in the temporary directory,
as before 2026-11-28; see broker_storage)). After an
untimed warm-up of each side (20,000 events), each round runs the five sides one after the other,
the order rotated round by round (each side into a fresh topic, each publisher run under a fresh
projection name); it prints each round with the load average, then the medians of the rates and
of the per-round ratios to the bare producer. A publisher's rate is given twice: from its workers'
start (its start-up, ~0.3-0.45 s, included) and from its first batch committed (steady). Then each
side's CPU per 1,000 events over its timed run (the machine's, the local broker's, PostgreSQL's;
from /proc), and the bound that bare + read-only CPU puts on a publisher on the cores it kept busy.
The publishers' workers run as the projection's workers are deployed (docs/projections.md, the
demo): by default 2 processes, each `projections run NAME --to-kafka TOPIC` with one worker (its
own pool, publisher and topic check, on journal.runtime); `--processes 1 --workers 2`: both in
this process, as one `projections run ... --workers 2`. The bare side is one producer in this
process, as a user would write it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import multiprocessing
import os
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from journal import EventEnvelope, JournalSettings, Write, failures, open_journal, runtime
from projections import Worker
from projections.kafka import GROUP_SIZE
from projections.kafka.local import LocalKafka
from projections.kafka.publisher import PRODUCER_DEFAULTS, KafkaPublisher
from projections.kafka.records import Record, RecordBuilder

try:
    from benchmarks._common import CpuMeter, _stat, fresh_database
except ImportError:  # run as a script from benchmarks/
    from _common import CpuMeter, _stat, fresh_database  # type: ignore[no-redef]


RAM_DISK, ROOM = Path("/dev/shm"), 8 << 30


def broker_storage(on_disk: bool) -> Path | None:
    """Where the local broker keeps its logs: a RAM disk with room for a run's records (8 GiB; a
    1M-event run writes ~5 GB), unless ``on_disk``; else the temporary directory. Why: on this
    machine's disk, after a minute of a run the disk's writeback stalled the broker's answers to
    produce requests for 150-250 ms (librdkafka's debug log), so a publisher's first batch
    committed after 0.55-0.8 s in the last rounds instead of 0.35-0.45 s, and the rounds' figures
    fell with their number, the publishers' most (docs/kafka.md, "Speed"). The broker's storage is
    the broker's, not what the benchmark compares; PostgreSQL stays on the disk (its commits are
    a projection's own cost)."""
    if on_disk or not RAM_DISK.is_dir():
        return None
    st = os.statvfs(RAM_DISK)
    return RAM_DISK if st.f_bavail * st.f_frsize >= ROOM else None


@contextlib.contextmanager
def broker(storage: Path | None) -> Iterator[tuple[str, int | None]]:
    """The brokers' address, and the local broker's process id (None for KAFKA_BOOTSTRAP_SERVERS)."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield os.environ["KAFKA_BOOTSTRAP_SERVERS"], None
        return
    with LocalKafka(heap="1G", storage=storage) as k:
        yield k.bootstrap_servers, k.process.pid if k.process else None


def busy_cpu() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting for I/O), from /proc/stat."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class Cpu:
    """CPU milliseconds per 1,000 events of a side's timed run (its clock's start to its stop, so
    not a worker process's start): the whole machine's, and of it the broker's and PostgreSQL's (its
    postmaster and backends); the rest is the Python processes' (the workers, or the bare
    producer). Where a side's events cost more than the bare producer's, and on which process,
    when the 2 cores are the bound."""

    def __init__(self, broker_pid: int | None = None, pg: CpuMeter | None = None) -> None:
        self.broker_pid = broker_pid
        self.pg = pg
        self._at: tuple[float, float, float] = (0.0, 0.0, 0.0)
        self.used: tuple[float, float, float] = (0.0, 0.0, 0.0)
        """The last run's (machine, broker, PostgreSQL) ms per 1,000 events (nan: not measured)."""

    def _now(self) -> tuple[float, float, float]:
        broker = _stat(self.broker_pid) if self.broker_pid else None
        pg = self.pg.server_now() if self.pg else None
        return busy_cpu(), broker[1] if broker else float("nan"), pg if pg is not None else float("nan")

    def start(self) -> None:
        self._at = self._now()

    def stop(self, n: int) -> None:
        a, b, c = ((after - before) / n * 1e6 for before, after in zip(self._at, self._now(), strict=True))
        self.used = (a, b, c)


CPU = Cpu()
"""The benchmark's meter (:func:`main` sets the broker's and PostgreSQL's processes)."""


def new_topic(bootstrap: str, partitions: int = 8) -> str:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept until the futures resolve
    for f in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        f.result(30)
    return topic


async def produce(p: Producer, topic: str, records: Iterable[Record]) -> None:
    """Hand each record to ``p``, waiting for deliveries while its local queue is full."""
    for key, value, headers in records:
        while True:
            try:
                p.produce(topic, value, key, headers=headers)
                break
            except BufferError:
                await asyncio.to_thread(p.poll, 0.1)


async def bare(bootstrap: str, envs: list[EventEnvelope]) -> tuple[float, float]:
    """The same records through one idempotent producer (the publisher's producer settings),
    flushed at the end; building the records and making the producer (which then asks for its
    producer id) are timed, as the publisher's are."""
    topic = new_topic(bootstrap)
    CPU.start()
    t0 = time.perf_counter()
    p = Producer({**PRODUCER_DEFAULTS, "bootstrap.servers": bootstrap, "enable.idempotence": True})
    await produce(p, topic, RecordBuilder().records(envs))
    await asyncio.to_thread(p.flush, 60)
    rate = len(envs) / (time.perf_counter() - t0)
    CPU.stop(len(envs))
    return rate, rate


async def bare_transactional(bootstrap: str, envs: list[EventEnvelope], group_size: int) -> tuple[float, float]:
    """The same records through one transactional producer, one Kafka transaction per
    ``group_size`` records (the publisher's batch), each committed before the next begins: the
    cost of Kafka's transactions alone, exactly-once's ceiling. Its ``init_transactions`` is timed,
    as the publisher's is."""
    topic = new_topic(bootstrap)
    CPU.start()
    t0 = time.perf_counter()
    p = Producer({**PRODUCER_DEFAULTS, "bootstrap.servers": bootstrap, "transactional.id": f"bench-{topic}"})
    await asyncio.to_thread(p.init_transactions, 30)
    records = RecordBuilder().records(envs)
    for _ in range(0, len(envs), group_size):
        p.begin_transaction()
        await produce(p, topic, itertools.islice(records, group_size))
        await asyncio.to_thread(p.commit_transaction, 60)
    rate = len(envs) / (time.perf_counter() - t0)
    CPU.stop(len(envs))
    return rate, rate


async def read_only(conn: object, envelopes: object) -> None:
    """The handler of the read-only side: the workers read the journal, nothing is published."""


def mode(eo: bool | None) -> str:
    return "read-only" if eo is None else "exactly-once" if eo else "at-least-once"


async def publish(
    j: object, s: JournalSettings, et: str, bootstrap: str, n: int, workers: int, eo: bool | None
) -> tuple[float, float]:
    """Workers of a fresh projection publish all ``n`` events: the rate timed from the topic check
    and their start (lease rounds, producers' start, ``init_transactions``, reading the offsets
    topic back) to the last event committed, and the steady rate, from the first batch committed
    to the last. Prints how long the first batch took to commit (the start-up part)."""
    topic = new_topic(bootstrap)
    publisher = None if eo is None else KafkaPublisher(bootstrap, topic, exactly_once=eo)
    handler = publisher or read_only
    ws = [Worker(j, s, f"bench-{topic}", et, handler, "grouped") for _ in range(workers)]  # type: ignore[arg-type]
    CPU.start()
    t0 = time.perf_counter()
    if publisher:  # as `projections run --to-kafka` does before its workers start
        await publisher.check(f"bench-{topic}")
    tasks = [asyncio.create_task(w.run()) for w in ws]
    first: float | None = None
    first_done = 0
    while (done := sum(w.stats.events for w in ws)) < n:
        if first is None and done:
            first, first_done = time.perf_counter() - t0, done
        for task in tasks:
            if task.done():
                task.result()
        await asyncio.sleep(0.02)
    took = time.perf_counter() - t0
    CPU.stop(n)
    rate = n / took
    steady = (n - first_done) / (took - first) if first is not None and took > first else rate
    for w in ws:
        w.stop()
    await asyncio.gather(*tasks)
    if publisher:
        await publisher.close()
    print(f"  ({mode(eo)}: first batch committed after {first or 0:.2f} s)")
    return rate, steady


async def publish_in_processes(
    dsn: str, group_size: int, buffer_size: int, et: str, bootstrap: str, n: int, processes: int, workers: int,
    eo: bool | None,
) -> tuple[float, float]:  # fmt: skip
    """As :func:`publish`, the workers run as ``projections run NAME --to-kafka TOPIC --workers
    K`` runs them, in ``processes`` such processes (each on ``journal.runtime``, its own pool and
    publisher, its own topic check): timed from the moment all are ready (started, imported, the
    journal opened), as :func:`publish` is from its topic check."""
    topic = new_topic(bootstrap)
    ctx = multiprocessing.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    counts = ctx.Array("q", [-1] * processes, lock=False)  # -1: not ready yet; then events processed
    args = (dsn, group_size, buffer_size, bootstrap, topic, et, workers, eo, go, stop, counts)
    procs = [ctx.Process(target=_worker_process, args=(*args, k), daemon=True) for k in range(processes)]
    for proc in procs:
        proc.start()
    while min(counts) < 0:
        if any(proc.exitcode is not None for proc in procs):
            raise RuntimeError("a worker process ended before it was ready")
        await asyncio.sleep(0.02)
    CPU.start()
    t0 = time.perf_counter()
    go.set()
    first: float | None = None
    first_done = 0
    while (done := sum(counts)) < n:
        if first is None and done:
            first, first_done = time.perf_counter() - t0, done
        if any(proc.exitcode is not None for proc in procs):
            raise RuntimeError("a worker process ended before all events were published")
        await asyncio.sleep(0.02)
    took = time.perf_counter() - t0
    CPU.stop(n)
    rate = n / took
    steady = (n - first_done) / (took - first) if first is not None and took > first else rate
    stop.set()
    for proc in procs:
        await asyncio.to_thread(proc.join, 60)
    shares = " / ".join(f"{c:,}" for c in counts)
    print(f"  ({mode(eo)}, {processes} processes: first batch after {first or 0:.2f} s; events per process {shares})")
    return rate, steady


def _worker_process(
    dsn: str, group_size: int, buffer_size: int, bootstrap: str, topic: str, et: str, workers: int, eo: bool | None,
    go: Any, stop: Any, counts: Any, slot: int,
) -> None:  # fmt: skip
    """One worker process of :func:`publish_in_processes`."""
    runtime.run(_serve(dsn, group_size, buffer_size, bootstrap, topic, et, workers, eo, go, stop, counts, slot))


async def _serve(
    dsn: str, group_size: int, buffer_size: int, bootstrap: str, topic: str, et: str, workers: int, eo: bool | None,
    go: Any, stop: Any, counts: Any, slot: int,
) -> None:  # fmt: skip
    s = JournalSettings.load(env={}, dsn=dsn, group_size=group_size, buffer_size=buffer_size)
    async with open_journal(dsn, settings=s) as j:
        publisher = None if eo is None else KafkaPublisher(bootstrap, topic, exactly_once=eo)
        handler = publisher or read_only
        ws = [Worker(j, s, f"bench-{topic}", et, handler, "grouped") for _ in range(workers)]  # type: ignore[arg-type]
        counts[slot] = 0
        await asyncio.to_thread(go.wait)
        if publisher:  # as the command does before its workers start
            await publisher.check(f"bench-{topic}")
        tasks = [asyncio.create_task(w.run()) for w in ws]
        while not stop.is_set():
            counts[slot] = sum(w.stats.events for w in ws)
            for task in tasks:
                if task.done():
                    task.result()
            await asyncio.sleep(0.02)
        for w in ws:
            w.stop()
        await asyncio.gather(*tasks)
        if publisher:
            await publisher.close()


async def main(
    dsn: str,
    bootstrap: str,
    broker_pid: int | None,
    n: int,
    entities: int,
    group_size: int,
    buffer_size: int,
    processes: int,
    workers: int,
    rounds: int,
) -> None:
    et = f"Bench{uuid.uuid4().hex[:6]}"
    # ids spread over the slices as an application's are: names that differ only in their last
    # characters ("e0".."e399") hash into a few neighbouring slices, which gave one worker 3-97%
    # of the events depending on the entity type's random name
    rng = random.Random(entities)
    pids = [f"{et}|{uuid.UUID(int=rng.getrandbits(128))}" for _ in range(entities)]
    s = JournalSettings.load(env={}, dsn=dsn, group_size=group_size, buffer_size=buffer_size)
    async with open_journal(dsn, settings=s) as j:
        per_call, done = 500, 0
        while done < n:
            parts = [
                Write(pids[(done // per_call + k) % entities], [{"v": i, "pad": "x" * 40} for i in range(per_call)])
                for k in range(min(20, max(1, (n - done) // per_call)))
            ]
            out = await asyncio.wait_for(j.persist_many(parts), 120)
            assert not failures(out), failures(out)[:3]
            done += len(parts) * per_call
        n = done
        envs = [e async for e in j.current_events_by_slices(et, 0, 1023)]
        assert len(envs) == n
        low = sum(1 for e in envs if e.slice < 512)
        print(f"events in slices 0-511 / 512-1023: {low:,} / {n - low:,}")

        def publisher(m: int, eo: bool | None) -> Awaitable[tuple[float, float]]:
            if processes > 1:
                return publish_in_processes(dsn, group_size, buffer_size, et, bootstrap, m, processes, workers, eo)
            return publish(j, s, et, bootstrap, m, workers, eo)

        sides: dict[str, Callable[[], Awaitable[tuple[float, float]]]] = {
            "bare": lambda: bare(bootstrap, envs),
            "bare transactional": lambda: bare_transactional(bootstrap, envs, group_size),
            "exactly-once": lambda: publisher(n, True),
            "at-least-once": lambda: publisher(n, False),
            "read-only": lambda: publisher(n, None),
        }
        warm = min(n, 20_000)  # untimed: the broker's JIT, its transaction-state topic, the pools
        await bare(bootstrap, envs[:warm])
        await bare_transactional(bootstrap, envs[:warm], group_size)
        await publisher(warm, True)
        await publisher(warm, False)
        await publisher(warm, None)
        conn = await asyncpg.connect(dsn)
        CPU.broker_pid, CPU.pg = broker_pid, CpuMeter(conn.get_server_pid())
        await conn.close()
        rates: dict[str, list[float]] = {name: [] for name in sides}
        steady: dict[str, list[float]] = {name: [] for name in sides}
        cpus: dict[str, list[tuple[float, ...]]] = {name: [] for name in sides}
        where = f"{processes} processes x {workers}" if processes > 1 else f"one process, {workers}"
        print(f"{n} events, {where} worker(s), group_size {group_size}, buffer_size {buffer_size}, {rounds} round(s)")
        for r in range(rounds):
            order = list(sides)[r % len(sides) :] + list(sides)[: r % len(sides)]
            for name in order:
                rate, after_start = await sides[name]()
                rates[name].append(rate)
                steady[name].append(after_start)
                cpus[name].append(CPU.used)
            line = ", ".join(f"{name} {rates[name][-1]:,.0f} (steady {steady[name][-1]:,.0f})" for name in order)
            print(f"round {r + 1}: {line} ev/s; load average {os.getloadavg()[0]:.1f}")
    med = {name: statistics.median(v) for name, v in rates.items()}
    print(f"medians, each ratio the median of the rounds' ratios (load average {os.getloadavg()[0]:.1f}):")
    print(f"bare idempotent producer (ceiling): {med['bare']:12,.0f} events/s")
    txn = statistics.median(a / b for a, b in zip(rates["bare transactional"], rates["bare"], strict=True))
    print(f"bare transactional producer:        {med['bare transactional']:12,.0f} events/s  ({txn:.2f} of bare)")
    for name in ("exactly-once", "at-least-once"):
        ratio = statistics.median(a / b for a, b in zip(rates[name], rates["bare"], strict=True))
        after = statistics.median(steady[name])
        after_ratio = statistics.median(a / b for a, b in zip(steady[name], rates["bare"], strict=True))
        of_txn = ""
        if name == "exactly-once":
            r_txn = statistics.median(a / b for a, b in zip(rates[name], rates["bare transactional"], strict=True))
            of_txn = f", {r_txn:.2f} of bare transactional"
        print(
            f"{name + ' publisher:':35s} {med[name]:12,.0f} events/s  ({ratio:.2f} of bare{of_txn}); "
            f"after its first batch {after:,.0f} events/s ({after_ratio:.2f})"
        )
    print(f"read-only workers (no handler work):  {med['read-only']:12,.0f} events/s")
    print("CPU per 1,000 events, medians (ms): all processes = broker + PostgreSQL + Python (the rest)")
    every: dict[str, float] = {}
    for name, per_round in cpus.items():
        every[name], on_broker, on_pg = (statistics.median(u[k] for u in per_round) for k in range(3))
        rest = every[name] - on_broker - on_pg
        print(f"  {name + ':':22s} {every[name]:6.2f} = {on_broker:5.2f} + {on_pg:5.2f} + {rest:5.2f}")
    # a publisher does at least what the bare producer does and what the read-only workers do: on
    # the cores the publishers kept busy, that much CPU per event bounds its rate
    floor = every["bare"] + every["read-only"]
    for name in ("exactly-once", "at-least-once"):
        cores = statistics.median(r * u[0] / 1e6 for r, u in zip(rates[name], cpus[name], strict=True))
        bound = cores * 1e6 / floor
        print(
            f"{name}: {cores:.2f} cores busy; bare + read-only {floor:.2f} ms per 1,000 events would allow at most"
            f" {bound:,.0f} events/s on them ({bound / med['bare']:.2f} of bare)"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--entities", type=int, default=10_000)
    defaults = JournalSettings.load(env={})
    ap.add_argument("--group-size", type=int, default=GROUP_SIZE, help="events a batch (a Kafka transaction)")
    ap.add_argument("--buffer-size", type=int, default=defaults.query.buffer_size, help="rows a page of the query")
    ap.add_argument("--processes", type=int, default=2, help="worker processes (1: the workers in this process)")
    ap.add_argument("--workers", type=int, default=1, help="workers (slice ranges) per process")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of the five sides, order rotated")
    ap.add_argument("--asyncio", action="store_true", help="asyncio.run, the collector untuned (every side)")
    ap.add_argument("--broker-on-disk", action="store_true", help="the local broker's logs on the disk, not a RAM disk")
    a = ap.parse_args()
    tuned = f"journal.runtime: {runtime.loop_name()}, collector tuned"
    print("# event loop:", "asyncio, collector untuned" if a.asyncio else tuned)
    storage = broker_storage(a.broker_on_disk)
    if not os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        print("# the local broker's logs:", f"{storage} (a RAM disk)" if storage else "the temporary directory (disk)")
    with fresh_database() as dsn, broker(storage) as (bootstrap, broker_pid):
        sizes = (a.events, a.entities, a.group_size, a.buffer_size, a.processes, a.workers, a.rounds)
        go = main(dsn, bootstrap, broker_pid, *sizes)
        if a.asyncio:
            asyncio.run(go)
        else:  # as `projections run --to-kafka` runs its workers
            runtime.run(go)
