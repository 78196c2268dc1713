"""What payload encryption and compression cost per event, beside the plain path (the default:
no codec), as ratios measured in the same run.

(1) in process, per event: serialize + seal (the write side) and open + deserialize (the read
    side), for a small event (the write benchmark's, ~60 bytes of JSON) and a large one (~4 KB);
    keys come from a dict (no I/O), so this is the codec's own CPU;
(2) through the journal on the database: events/s of concurrent persists and of a slice query
    catch-up, plain vs encrypted (keys from the encryption_key table, cached).

    python benchmarks/codec_cost.py [--n 20000] [--entities 500] [--events 40000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from journal import JournalSettings, SerializerRegistry, open_journal, runtime
from journal.codec import PayloadCodec

try:
    from benchmarks._common import fresh_database, header
except ImportError:  # run as a script from benchmarks/
    from _common import fresh_database, header  # type: ignore[no-redef]


class DictKeys:
    """A key store in memory: the codec's own cost, without the database."""

    def __init__(self) -> None:
        self.keys: dict[str, bytes | None] = {}

    async def data_keys(self, subjects: Sequence[str], *, create: bool) -> dict[str, bytes | None]:
        for s in subjects:
            if create:
                self.keys.setdefault(s, os.urandom(32))
        return {s: self.keys[s] for s in subjects if s in self.keys}

    async def forget(self, subject: str) -> bool:
        return self.keys.pop(subject, None) is not None


SMALL = {"item": "sku-17", "qty": 3, "price": 1999}
LARGE = {"text": "lorem ipsum dolor sit amet, " * 150, "qty": 3}

CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("plain (default: no codec)", {}),
    ("encrypted", {"encrypt": True}),
    ("compressed above 1 KB", {"compress_above": 1024}),
    ("encrypted + compressed above 1 KB", {"encrypt": True, "compress_above": 1024}),
]


def registry(cfg: dict[str, Any]) -> SerializerRegistry:
    r = SerializerRegistry()
    if cfg:
        keys = DictKeys() if cfg.get("encrypt") else None
        r.use_codec(PayloadCodec(keys, compress_above=cfg.get("compress_above", 0)))
    return r


def per_event(fn: Callable[[], Any], n: int) -> float:
    best = float("inf")
    for _ in range(3):  # the best of three: the shared machine's load swings
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


async def in_process(n: int) -> None:
    print("(1) in process, microseconds per event (best of 3), ratio to plain")
    for label, event in (("small", SMALL), ("large", LARGE)):
        base: tuple[float, float] | None = None
        for name, cfg in CONFIGS:
            r = registry(cfg)
            pids = [f"bench|{i}" for i in range(100)]
            await r.load_write_keys(pids)
            ser = r.serialize(event, pid=pids[0])
            write = per_event(lambda: r.serialize_events([event], pids[0]), n)  # noqa: B023
            read = per_event(lambda: r.deserialize(ser.ser_id, ser.manifest, ser.payload, pid=pids[0]), n)  # noqa: B023
            base = base or (write, read)
            print(
                f"    {label:5} {name:<36} write {write:6.2f} us ({write / base[0]:4.2f}x)   "
                f"read {read:6.2f} us ({read / base[1]:4.2f}x)   stored {len(ser.payload):>5} bytes"
            )


async def through_the_journal(dsn: str, entities: int, events: int) -> None:
    print("(2) through the journal on the database, events/s, ratio to plain")
    per = max(1, events // entities)
    base: tuple[float, float] | None = None
    for name, cfg in CONFIGS[:2]:
        settings = JournalSettings.load(env={}, dsn=dsn, **cfg)
        et = "Plain" if not cfg else "Sealed"
        async with open_journal(dsn, settings=settings) as j:

            async def entity(e: int, j: Any = j, et: str = et) -> None:
                for k in range(per):
                    await j.persist(f"{et}|{e}", [SMALL], expected_seq_nr=k)

            t0 = time.perf_counter()
            await asyncio.gather(*(entity(e) for e in range(entities)))
            write = entities * per / (time.perf_counter() - t0)
        async with open_journal(dsn, settings=settings) as j:  # a restart: keys are loaded by the read
            t0 = time.perf_counter()
            n = 0
            async for env in j.current_events_by_slices(et, 0, 1023):
                _ = env.event
                n += 1
            read = n / (time.perf_counter() - t0)
        base = base or (write, read)
        print(
            f"    {name:<36} persist {write:>9,.0f} ev/s ({write / base[0]:4.2f}x)   "
            f"slice read {read:>9,.0f} ev/s ({read / base[1]:4.2f}x)"
        )


async def run(dsn: str, args: argparse.Namespace) -> None:
    header("codec_cost: encryption and compression beside the plain path")
    await in_process(args.n)
    await through_the_journal(dsn, args.entities, args.events)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--entities", type=int, default=500)
    p.add_argument("--events", type=int, default=40_000)
    args = p.parse_args()
    with fresh_database() as dsn:
        runtime.run(run(dsn, args))
