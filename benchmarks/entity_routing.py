"""Commands per second of entities with routing and a view attached, beside plain entities.

    flock /tmp/sj-bench.lock .venv/bin/python benchmarks/entity_routing.py [--entities 200] [--commands 10]

Same run, same database (``JOURNAL_DSN`` or an embedded server), stateSync=True entities, one
event per command:

* plain: ``--entities`` entities, ``--commands`` commands each, issued concurrently;
* routed: the same load on another entity type whose every event is routed to one of
  ``--destinations`` destination entities, with an EventRouter and a View over the sources
  running; the clock stops only when every routed copy is written into its destination and the
  view has seen every event (a conditional query on the merged vector time of all writes).

The ratio routed / plain is the cost of routing and a view, end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import fresh_database, header
from journal import (
    Entity,
    EntityRegistry,
    EventRouter,
    JournalSettings,
    VectorTime,
    View,
    after_persist,
    open_journal,
)


class Plain(Entity[int]):
    entity_type = "plain"

    def initial_state(self) -> int:
        return 0

    def on_command(self, command: Any) -> Any:
        if command is None:  # a query
            return self.state
        self.persist(command)
        return after_persist(lambda: self.state)

    def on_event(self, state: int, event: Any) -> int:
        return state + 1


class Source(Plain):
    entity_type = "source"
    destinations = 10

    def on_command(self, command: Any) -> Any:
        dest = f"sink|{int(self.entity_id) % Source.destinations}"
        self.persist(command, destinations=[dest])
        return after_persist(lambda: self.state)


class Sink(Plain):
    entity_type = "sink"


class Count(View[int]):
    view_id = "bench-count"
    entity_types = ("source",)

    def initial_state(self) -> int:
        return 0

    def on_event(self, state: int, event: Any) -> int:
        return state + 1

    def on_query(self, state: int, query: Any) -> Any:
        return state


async def drive(reg: EntityRegistry, cls: type[Plain], entities: int, commands: int) -> VectorTime:
    async def one(i: int) -> VectorTime:
        vt = VectorTime()
        for c in range(commands):
            vt = vt.merge((await reg.ask_timed(cls, str(i), c)).vector_time)
        return vt

    out = VectorTime()
    for vt in await asyncio.gather(*(one(i) for i in range(entities))):
        out = out.merge(vt)
    return out


async def bench(dsn: str, entities: int, commands: int, destinations: int) -> None:
    Source.destinations = destinations
    total = entities * commands
    settings = JournalSettings.load(env={}, dsn=dsn)
    async with open_journal(dsn, settings=settings) as j, EntityRegistry(j) as reg:
        reg.register(Sink)
        t0 = time.perf_counter()
        await drive(reg, Plain, entities, commands)
        plain = total / (time.perf_counter() - t0)
        print(f"plain entities          : {total:>7} commands {plain:>9,.0f}/s")
        async with EventRouter(reg, ["source"], router_id="bench") as router, Count(j) as view:
            t0 = time.perf_counter()
            vt = await drive(reg, Source, entities, commands)
            written = time.perf_counter() - t0
            assert await view.ask("n", after=vt, timeout=600) == total
            for d in range(destinations):  # every copy is in its sink: conditional queries
                mine = {f"source|{i}": commands for i in range(entities) if i % destinations == d}
                assert await reg.ask(Sink, str(d), None, after=mine, timeout=600) == commands * len(mine)
            routed = total / (time.perf_counter() - t0)
            assert router.delivered == total, router.delivered
        print(f"routed + view (written) : {total:>7} commands {total / written:>9,.0f}/s")
        print(f"routed + view (end to end, every copy and the view caught up): {routed:>9,.0f}/s")
        print(f"ratio routed+view / plain: {routed / plain:.2f} (writes only {total / written / plain:.2f})")
        print(f"load average: {os.getloadavg()}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--entities", type=int, default=200)
    p.add_argument("--commands", type=int, default=10)
    p.add_argument("--destinations", type=int, default=10)
    a = p.parse_args()
    header("entity routing: commands/s with routing and a view, beside plain entities")
    with fresh_database() as dsn:
        asyncio.run(bench(dsn, a.entities, a.commands, a.destinations))


if __name__ == "__main__":
    main()
