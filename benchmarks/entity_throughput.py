"""Entity command throughput (stateSync on and off) beside the journal's group-commit write rate.

    python benchmarks/entity_throughput.py --dsn postgresql://postgres@127.0.0.1:5432/postgres \
        [--entities 10000] [--commands-per-entity 3]

Creates a throwaway database on that server, migrates it, and drops it at the end. Every
command writes one event. The ceiling is ``Journal.persist`` itself: the same number of
single-event writes over the same pids, issued concurrently (group commit across pids).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from journal import Entity, EntityRegistry, EventEnvelope, Journal, JournalSettings, open_journal
from journal.entities import Processor, WriterHandler
from journal.postgres.migrations import upgrade
from projections import Worker


class Acc(Entity[int]):
    entity_type = "bench"

    def initial_state(self) -> int:
        return 0

    def on_command(self, command: Any) -> Any:
        if command:
            self.persist({"n": command})
        return self.state

    def on_event(self, state: int, event: dict[str, int]) -> int:
        return state + event["n"]


class LazyAcc(Acc):
    entity_type = "lazybench"
    state_sync = False


async def rate(label: str, n: int, coros: list[Any]) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*coros)
    dt = time.perf_counter() - t0
    r = n / dt
    print(f"{label:<44} {n:>7} in {dt:6.2f}s = {r:>9,.0f}/s")
    return r


async def bench(dsn: str, entities: int, per: int) -> None:
    settings = JournalSettings.load(env={}, dsn=dsn, pool_max_size=10)
    total = entities * per
    async with open_journal(dsn, settings=settings) as j:
        ids = [str(i) for i in range(entities)]
        ceiling = 0.0
        for rnd in range(per):
            ceiling += await rate(
                f"journal.persist round {rnd + 1} (1 event/pid)", entities,
                [j.persist(f"raw|{i}", [{"n": 1}]) for i in ids],
            )  # fmt: skip
        ceiling /= per
        results = {}
        for cls in (Acc, LazyAcc):
            async with EntityRegistry(j) as reg:
                await rate(f"{cls.__name__}: activate (recover) entities", entities,
                           [reg.ask(cls, i, 0) for i in ids])  # fmt: skip
                results[cls.state_sync] = await rate(
                    f"{cls.__name__} stateSync={cls.state_sync is not False}: commands", total,
                    [reg.ask(cls, i, 1) for _ in range(per) for i in ids],
                )  # fmt: skip
                sample = await reg.ask(cls, ids[0], 0)
                assert sample == per, sample
        processed = await processor_rate(j, settings, total)
    on, off = results[None], results[False]
    print()
    print(f"journal group-commit write rate (ceiling): {ceiling:>9,.0f} writes/s")
    print(f"entities stateSync=True : {on:>9,.0f} commands/s  ratio {on / ceiling:.2f}")
    print(f"entities stateSync=False: {off:>9,.0f} commands/s  ratio {off / ceiling:.2f}")
    print(f"processor (1 output/event, runner)  : {processed:>9,.0f} source events/s  ratio {processed / ceiling:.2f}")
    print(f"load average: {os.getloadavg()}")


async def processor_rate(j: Journal, settings: JournalSettings, total: int) -> float:
    """A Processor on the projection runner copying the stateSync=True entities' events."""

    def copy(env: EventEnvelope) -> list[Any]:
        return [env.event]

    p = Processor(j, "bench-copy", "benchout", copy, batch_size=1000)
    worker = Worker(j, settings, "bench-copy", "bench", WriterHandler(p), "grouped")
    t0 = time.perf_counter()
    task = asyncio.create_task(worker.run())
    while p.written < total:
        if task.done():
            await task
            raise RuntimeError("processor stopped early")
        await asyncio.sleep(0.05)
    dt = time.perf_counter() - t0
    worker.stop()
    await task
    print(f"{'Processor on the runner: source events':<44} {total:>7} in {dt:6.2f}s = {total / dt:>9,.0f}/s")
    return total / dt


def with_db(dsn: str, db: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + db))


async def admin(dsn: str, sql: str) -> None:
    c = await asyncpg.connect(dsn)
    try:
        await c.execute(sql)
    finally:
        await c.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", default=os.environ.get("JOURNAL_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"))
    p.add_argument("--entities", type=int, default=10_000)
    p.add_argument("--commands-per-entity", type=int, default=3)
    a = p.parse_args()
    name = f"sjbench_{uuid.uuid4().hex[:10]}"
    asyncio.run(admin(a.dsn, f'CREATE DATABASE "{name}"'))
    try:
        db = with_db(a.dsn, name)
        upgrade(db)
        asyncio.run(bench(db, a.entities, a.commands_per_entity))
    finally:
        asyncio.run(admin(a.dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


if __name__ == "__main__":
    main()
