"""Replication latency A -> B to B's live query, beside its floor measured in the same run (issue 37
item 1: p99 <= 10 ms at 5k events/s).

Two sides, both as the same processes: this one writes at A and listens at B; two others relay.
- journal: endpoints A and B (``journal endpoint run``, update notifications on); events persisted
  at A, delivered by B's live slice query (``events_by_slices`` over all slices).
- floor: the same chain with no journal code: an INSERT + ``pg_notify`` committed on A's database
  (one statement) -> a bare LISTEN in relay process A wakes -> one gRPC unary call carrying the
  notified keys to relay process B -> an INSERT + ``pg_notify`` committed on B's database -> a bare
  LISTEN here wakes. Relay A keeps one call in flight; what arrives meanwhile goes in the next.

Two loads, each in ``--rounds`` paired rounds (the two sides back to back, their order rotated):
- one at a time: ``--events`` events, each written once the previous one was delivered, then 50 ms;
- at a rate: ``--rate`` events/s for ``--seconds``, written by a loop that wakes every ``--tick-ms``
  and writes what is due in one call (``persist_many`` of one event per pid; the floor: one
  INSERT), each event timed from the instant it was due (the writer's lag counts).
p50/p99 per round; printed: the medians over the rounds and journal / floor as a ratio.

    flock /tmp/sj-bench.lock .venv/bin/python -m benchmarks.replication_latency [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import grpc

from benchmarks._common import CpuMeter, _load, _stat, header
from benchmarks.replication_throughput import LOG, endpoint, free_address, ready
from journal import JournalSettings, open_journal, runtime
from journal.postgres.migrations import upgrade
from tests.support.scratch import scratch_database

TABLE = "CREATE TABLE IF NOT EXISTS floor_event (id bigint PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())"
PUT = "WITH i AS (INSERT INTO floor_event (id) SELECT unnest($1::bigint[]) RETURNING 1) SELECT pg_notify('floor', $2)"
METHOD = "/floor.Relay/Put"
Write = Callable[[Sequence[int]], Awaitable[Any]]


# -- the floor's relays (processes) -------------------------------------------------------------


async def relay_a(dsn: str, to: str) -> None:
    """LISTEN on A; per wake-up one gRPC call with every key notified since the last call."""
    conn = await asyncpg.connect(dsn)
    pending: list[str] = []
    wake = asyncio.Event()

    def on(_c: object, _pid: int, _channel: str, payload: object) -> None:
        pending.append(str(payload))
        wake.set()

    await conn.add_listener("floor", on)
    async with grpc.aio.insecure_channel(to) as channel:
        await channel.channel_ready()
        put = channel.unary_unary(METHOD)
        print("ready", flush=True)
        while True:
            await wake.wait()
            wake.clear()
            keys = ",".join(pending)
            pending.clear()
            await put(keys.encode())


async def relay_b(dsn: str, listen: str) -> None:
    """A gRPC server whose one call inserts the keys into B and notifies them, committed."""
    conn = await asyncpg.connect(dsn)
    await conn.execute(TABLE)

    async def on_put(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        keys = request.decode()
        await conn.execute(PUT, [int(k) for k in keys.split(",")], keys)
        return b""

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler("floor.Relay", {"Put": grpc.unary_unary_rpc_method_handler(on_put)})
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(listen)
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


@contextlib.contextmanager
def relay(*args: str) -> Iterator[int]:
    cmd = [sys.executable, "-m", "benchmarks.replication_latency", "--relay", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, cwd=Path(__file__).resolve().parent.parent)
    try:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"floor relay {args[0]} did not start")
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


# -- measuring ------------------------------------------------------------------------------------


class Tracker:
    """When each key was due, and how long each took to be delivered."""

    def __init__(self) -> None:
        self.due: dict[int, float] = {}
        self.latencies: list[float] = []
        self.drained = asyncio.Event()

    def start(self) -> None:
        self.due.clear()
        self.latencies = []
        self.drained.clear()

    def delivered(self, key: int) -> None:
        t = self.due.pop(key, None)
        if t is not None:
            self.latencies.append(time.perf_counter() - t)
            if not self.due:
                self.drained.set()


class Keys:
    """Keys never reused across rounds and sides."""

    def __init__(self) -> None:
        self.next = 0

    def take(self, n: int) -> range:
        r = range(self.next, self.next + n)
        self.next += n
        return r


async def one_at_a_time(write: Write, tracker: Tracker, keys: Keys, events: int) -> list[float]:
    tracker.start()
    for key in keys.take(events):
        tracker.drained.clear()
        tracker.due[key] = time.perf_counter()
        await write([key])
        async with asyncio.timeout(60):
            await tracker.drained.wait()
        await asyncio.sleep(0.05)
    return tracker.latencies


async def at_rate(write: Write, tracker: Tracker, keys: Keys, rate: float, seconds: float, tick: float) -> list[float]:
    tracker.start()
    todo = keys.take(int(rate * seconds))
    start = time.perf_counter()
    done = 0
    while done < len(todo):
        due = min(len(todo), int((time.perf_counter() - start) * rate) + 1)
        if due > done:
            batch = todo[done:due]
            for i, key in enumerate(batch, done):
                tracker.due[key] = start + i / rate
            await write(batch)
            done = due
        await asyncio.sleep(tick)
    achieved = len(todo) / (time.perf_counter() - start)
    async with asyncio.timeout(120):
        await tracker.drained.wait()
    if achieved < rate * 0.95:
        print(f"    (writer reached only {achieved:,.0f} events/s)")
    return tracker.latencies


class Side:
    """How a side writes, its two relay processes (CPU counted), and a backend of the server."""

    def __init__(self, write: Write, pids: tuple[int, int], backend: int = 0) -> None:
        self.write = write
        self.pids = pids
        self.backend = backend


class Cpu:
    """CPU ms per 1000 events of a measurement: this process, the two relays, the server."""

    def __init__(self, backend: int, pids: tuple[int, int]) -> None:
        self.meter = CpuMeter(backend)
        self.pids = pids

    def _relays(self) -> float:
        return sum(st[1] for st in map(_stat, self.pids) if st is not None)

    def __enter__(self) -> Cpu:
        self.meter.start()
        self._r0 = self._relays()
        return self

    def __exit__(self, *exc: object) -> None:
        self.meter.stop()
        self.relays = self._relays() - self._r0

    def per_1000(self, n: int) -> tuple[float, float, float]:
        return (self.meter.client * 1e6 / n, self.relays * 1e6 / n, (self.meter.server or 0.0) * 1e6 / n)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(len(s) * q))] * 1000


# -- the sides ------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def journal_side(a: str, b: str, tmp: Path, tracker: Tracker) -> Any:
    address_a, address_b = free_address(), free_address()
    common = {"logs": [LOG], "retry_delay": 5.0, "update_notifications": True}
    cfg_a = {"location": "A", "dsn": a, "listen": address_a, **common}
    cfg_b = {"location": "B", "dsn": b, "listen": address_b, "connections": [{"address": address_a}], **common}
    with endpoint(tmp, cfg_a) as pa, endpoint(tmp, cfg_b) as pb:
        await ready(address_a)
        await ready(address_b)
        async with (
            open_journal(a, settings=JournalSettings.load(dsn=a)) as ja,
            open_journal(b, settings=JournalSettings.load(dsn=b)) as jb,
        ):

            async def follow() -> None:
                async for env in jb.events_by_slices(LOG, 0, 1023):
                    tracker.delivered(env.event["lat"])

            async def write(batch: Sequence[int]) -> None:
                if len(batch) == 1:
                    await ja.persist(f"{LOG}|e{batch[0]}", [{"lat": batch[0]}])
                else:
                    await ja.persist_many([(f"{LOG}|e{k}", [{"lat": k}]) for k in batch])

            follower = asyncio.create_task(follow())
            try:
                yield Side(write, (pa.pid, pb.pid))
            finally:
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follower


@contextlib.asynccontextmanager
async def floor_side(a: str, b: str, tracker: Tracker) -> Any:
    address_b = free_address()
    conn_a = await asyncpg.connect(a)
    await conn_a.execute(TABLE)
    conn_b = await asyncpg.connect(b)

    def on(_c: object, _pid: int, _channel: str, payload: object) -> None:
        for k in str(payload).split(","):
            tracker.delivered(int(k))

    await conn_b.add_listener("floor", on)

    async def write(batch: Sequence[int]) -> None:
        await conn_a.execute(PUT, list(batch), ",".join(map(str, batch)))

    try:
        with relay("b", b, address_b) as pb, relay("a", a, address_b) as pa:
            yield Side(write, (pa, pb), conn_a.get_server_pid())
    finally:
        await conn_a.close()
        await conn_b.close()


Result = tuple[float, float, float, float, float]


async def measure(
    side: Side, backend: int, tracker: Tracker, keys: Keys, mode: str, args: argparse.Namespace
) -> Result:
    """One measurement: (p50 ms, p99 ms, CPU ms per 1000 events of this process, relays, server)."""
    with Cpu(backend, side.pids) as cpu:
        if mode == "one":
            lat = await one_at_a_time(side.write, tracker, keys, args.events)
        else:
            lat = await at_rate(side.write, tracker, keys, args.rate, args.seconds, args.tick_ms / 1000)
    return (pct(lat, 0.5), pct(lat, 0.99), *cpu.per_1000(len(lat)))


def print_mode(name: str, rs: dict[str, list[Result]], loads: list[float]) -> None:
    print(f"{name}: p50 / p99 ms, medians of {len(loads)} paired rounds; load {min(loads):.2f}-{max(loads):.2f}")
    for side in ("floor", "journal"):
        each = "  ".join(f"{r[0]:.1f}/{r[1]:.1f}" for r in rs[side])
        p50, p99 = (statistics.median(r[i] for r in rs[side]) for i in (0, 1))
        here, relays, server = (statistics.median(r[i] for r in rs[side]) for i in (2, 3, 4))
        print(f"    {side:<8} p50 {p50:6.1f}  p99 {p99:6.1f}   (rounds {each})")
        print(f"             CPU ms per 1000 events: writer+listener {here:.1f}, relays {relays:.1f}, "
              f"server {server:.1f}, all {here + relays + server:.1f}")  # fmt: skip
    pairs = list(zip(rs["journal"], rs["floor"], strict=True))
    r50 = statistics.median(j[0] / f[0] for j, f in pairs)
    r99 = statistics.median(j[1] / f[1] for j, f in pairs)
    verdict = "met" if statistics.median(r[1] for r in rs["journal"]) <= 10 else "missed"
    print(f"    journal / floor: p50 {r50:.2f} x, p99 {r99:.2f} x; goal p99 <= 10 ms: {verdict}")


async def run(dsns: dict[str, str], args: argparse.Namespace, tmp: Path) -> None:
    trackers = {"floor": Tracker(), "journal": Tracker()}
    keys = Keys()
    got: dict[str, dict[str, list[Result]]] = {"one": {}, "rate": {}}
    loads: list[float] = []
    async with (
        journal_side(dsns["a"], dsns["b"], tmp, trackers["journal"]) as js,
        floor_side(dsns["fa"], dsns["fb"], trackers["floor"]) as fs,
    ):
        sides: dict[str, Side] = {"floor": fs, "journal": js}
        for name, side in sides.items():  # warm up: the streams connected, the follower live
            await one_at_a_time(side.write, trackers[name], keys, 3)
        for k in range(args.rounds):
            loads.append(_load())
            order = ["floor", "journal"] if k % 2 == 0 else ["journal", "floor"]
            for mode in ("one", "rate"):
                for name in order:
                    r = await measure(sides[name], fs.backend, trackers[name], keys, mode, args)
                    got[mode].setdefault(name, []).append(r)
                    await asyncio.sleep(0.5)
    print_mode(f"one at a time ({args.events} events)", got["one"], loads)
    print_mode(f"{args.rate:,.0f} events/s for {args.seconds} s", got["rate"], loads)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--events", type=int, default=50, help="events per round, one at a time")
    p.add_argument("--rate", type=float, default=5000.0)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--tick-ms", type=float, default=1.0)
    p.add_argument("--relay", nargs=3, metavar=("SIDE", "DSN", "ADDRESS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.relay:
        side, dsn, address = args.relay
        runtime.run(relay_a(dsn, address) if side == "a" else relay_b(dsn, address))
        return
    header(f"replication latency and its floor; event loop {runtime.loop_name()}")
    with contextlib.ExitStack() as stack:
        server = os.environ.get("JOURNAL_DSN")
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sj-bench-lat-")))
        if not server:
            from journal.postgres.embedded import start_embedded

            server = start_embedded(tmp / "pgdata")
        dsns = {n: stack.enter_context(scratch_database(server, f"sjlat{n}")) for n in ("a", "b", "fa", "fb")}
        for n in ("a", "b"):
            upgrade(dsns[n])
        runtime.run(run(dsns, args, tmp))


if __name__ == "__main__":
    main()
