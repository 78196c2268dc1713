"""Writes on Cassandra: the journal vs the driver's own batched insert of the same rows, in the
same run, with the single-writer check (a lightweight transaction per call) on and off.

Many entities persist concurrently, ``--per-call`` events per call; the raw ceiling writes the
same rows (same partitions, one unlogged batch per call's rows) with the driver's
``execute_concurrent`` at the same concurrency. Uses CASSANDRA_CONTACT_POINTS, else starts a
local node through the project's runner. Run it alone (flock /tmp/sj-bench.lock).

    python -m benchmarks.cassandra_write [--entities 50] [--events 200] [--per-call 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid

from journal import JournalSettings, open_journal
from journal.cassandra.cql import statements
from journal.cassandra.partitions import PartitionLayout

try:
    from benchmarks._cassandra import BenchCassandra, cassandra_keyspace
    from benchmarks._common import alternate, header
except ImportError:  # run as a script from benchmarks/
    from _cassandra import BenchCassandra, cassandra_keyspace  # type: ignore[no-redef]
    from _common import alternate, header  # type: ignore[no-redef]


def payload(i: int) -> bytes:
    return json.dumps({"item": f"sku-{i % 977}", "qty": i % 7 + 1, "price": 1999}).encode()


def raw_batched(
    c: BenchCassandra, prefix: str, entities: int, per_entity: int, per_call: int, guarded: bool = False
) -> float:
    """The same rows as the journal writes (partition of the layout, static column set), one
    unlogged batch per call, each entity's calls one after the other and ``entities`` entities at
    once, on the driver's own callbacks (no asyncio). ``guarded``: each batch is conditional on the
    partition's ``highest_sequence_nr``, as the journal's single-writer check makes it (a
    lightweight transaction). Like the journal, it starts from the events as values: serializing
    them, stamping and binding the rows are inside the clock."""
    import threading

    from cassandra.query import BatchStatement, BatchType
    from cassandra.util import uuid_from_time

    cql = statements(c.keyspace)
    insert = c.session.prepare(cql["insert_message"])
    head = c.session.prepare(cql["guard_partition" if guarded else "mark_partition"])
    layout = PartitionLayout(500_000)
    writer = str(uuid.uuid4())
    calls = [events_of(first, per_call) for first in range(1, per_entity + 1, per_call)]
    finished, failures, left = threading.Event(), [], [entities]
    lock = threading.Lock()

    def batch(pid: str, first: int, events: list[dict[str, object]]) -> BatchStatement:
        part, last = layout.write_partition(first), first + len(events) - 1
        b = BatchStatement(batch_type=BatchType.UNLOGGED)
        b.add(head, (last, pid, part, first - 1 if first > 1 else None) if guarded else (last, pid, part))
        for n, event in enumerate(events, first):
            b.add(insert, (pid, part, n, uuid_from_time(time.time()), "0", writer, 1, "",
                           json.dumps(event).encode(), None, None, None, None))  # fmt: skip
        return b

    def done(error: BaseException | None = None) -> None:
        with lock:
            if error is not None:
                failures.append(error)
            left[0] -= 1
            if left[0] == 0:
                finished.set()

    def call(pid: str, k: int) -> None:
        if k == len(calls):
            return done()
        f = c.session.execute_async(batch(pid, k * per_call + 1, calls[k]))

        def ok(rows: list[object]) -> None:
            if guarded and not rows[0][0]:  # type: ignore[index]
                return done(RuntimeError(f"{pid}: the conditional batch of call {k} was not applied"))
            call(pid, k + 1)

        f.add_callbacks(ok, done)

    start = time.perf_counter()
    for e in range(entities):
        call(f"{prefix}|{e}", 0)
    finished.wait()
    elapsed = time.perf_counter() - start
    assert not failures, failures[0]
    return entities * per_entity / elapsed


def events_of(first: int, per_call: int) -> list[dict[str, object]]:
    """A call's events as values (both sides start from them)."""
    return [json.loads(payload(n)) for n in range(first, first + per_call)]


async def journal_writes(c: BenchCassandra, prefix: str, entities: int, per_entity: int, per_call: int,
                         check: bool) -> float:  # fmt: skip
    settings = JournalSettings.load(env={}, single_writer_check=check)
    async with open_journal(c.dsn, settings=settings) as j:
        calls = [events_of(n + 1, per_call) for n in range(0, per_entity, per_call)]

        async def entity(e: int) -> None:
            pid = f"{prefix}|{e}"
            for i, events in enumerate(calls):
                await j.persist(pid, events, expected_seq_nr=i * per_call)

        start = time.perf_counter()
        await asyncio.gather(*(entity(e) for e in range(entities)))
        return entities * per_entity / (time.perf_counter() - start)


def main(args: argparse.Namespace) -> None:
    per_entity = args.events - args.events % args.per_call
    header("cassandra_write")
    with cassandra_keyspace() as c:
        # warm up both paths (connections, prepared statements, JIT of the node)
        raw_batched(c, "warmraw", args.entities, args.per_call * 4, args.per_call)
        raw_batched(c, "warmlwt", args.entities, args.per_call * 4, args.per_call, guarded=True)
        asyncio.run(journal_writes(c, "warmj", args.entities, args.per_call * 4, args.per_call, True))
        # paired rounds, the sides' order rotated each round: the node warms up, the machine is shared
        e, n, k = args.entities, per_entity, args.per_call
        rounds = alternate(args.rounds, {
            "raw": lambda r: raw_batched(c, f"raw{r}", e, n, k),
            "raw_lwt": lambda r: raw_batched(c, f"rawlwt{r}", e, n, k, guarded=True),
            "off": lambda r: asyncio.run(journal_writes(c, f"off{r}", e, n, k, False)),
            "on": lambda r: asyncio.run(journal_writes(c, f"on{r}", e, n, k, True)),
        })  # fmt: skip
        print(f"# {e} entities x {n} events, {k} per call")
        rounds.report("single_writer_check off (plain batch)", "off", "raw", "ev/s", target=0.7)
        rounds.report("single_writer_check on (the default: lightweight transactions)", "on", "raw_lwt", "ev/s",
                      target=0.7)  # fmt: skip
        print(
            f"# the check costs {1 - rounds.ratio('on', 'off'):.0%} of the unchecked throughput; "
            f"Cassandra's lightweight transaction alone {1 - rounds.ratio('raw_lwt', 'raw'):.0%} of the raw one"
        )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--entities", type=int, default=50)
    p.add_argument("--events", type=int, default=200, help="events per entity")
    p.add_argument("--per-call", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    main(p.parse_args())
