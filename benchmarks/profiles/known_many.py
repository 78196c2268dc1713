"""(c) - (C) of write_throughput split (issue 37 item 3): persist_many of 1000 one-event parts
as the caller builds them, plain tuples or `Write` values, with and without expected_seq_nr,
against raw code building, serializing and inserting the same rows; call by call in turn (order
shuffled every round), client CPU by process_time, medians. Per variant: building the parts, the validator's
batch, the statements' parameters (both again on the same parts, not sent), and the whole call.

    python benchmarks/profiles/known_many.py [rounds] [asyncio|uvloop]

``asyncio``: the standard loop, gc untouched ((C)'s setting); ``uvloop``: journal.runtime.run,
uvloop and the collector tuned ((c)'s setting)."""

import asyncio
import random
import statistics
import sys
import time
import uuid

import asyncpg
import orjson

from benchmarks._common import fresh_database
from benchmarks.write_throughput import RAW_INSERT, payload
from journal import JournalSettings, Write, failures, open_journal, runtime, slice_for

PIDS = 1000
BUILD = {
    "tuples (pid, events)": lambda p, n: [(f"{p}|{e}", [payload(n)]) for e in range(PIDS)],
    "tuples (pid, events, n)": lambda p, n: [(f"{p}|{e}", [payload(n)], n) for e in range(PIDS)],
    "Write(pid, events)": lambda p, n: [Write(f"{p}|{e}", [payload(n)]) for e in range(PIDS)],
    "Write(pid, events, n)": lambda p, n: [Write(f"{p}|{e}", [payload(n)], n) for e in range(PIDS)],
}


async def main(dsn: str, rounds: int) -> None:
    conn = await asyncpg.connect(dsn)
    writer = str(uuid.uuid4())
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
        backend, validator = j.backend, j._validator
        cpu: dict[str, dict[str, list[float]]] = {
            k: {"build": [], "batch": [], "params": [], "call": []} for k in BUILD
        }
        cpu["raw from values"] = {"call": []}

        async def raw(n: int) -> None:
            names = [f"raw|{e}" for e in range(PIDS)]
            await conn.execute(
                RAW_INSERT, [slice_for(p) for p in names], names, [n + 1] * PIDS,
                [orjson.dumps(payload(n)) for _ in names], writer,
            )  # fmt: skip

        names = list(cpu)
        order = random.Random(37)
        for n in range(rounds):
            # a shuffled order each round: a rotation keeps each variant's predecessor, whose freed
            # memory the next one faults in again (0.3-0.4 ms of a build after raw's)
            for name in order.sample(names, len(names)):
                if name == "raw from values":
                    c = time.process_time()
                    await raw(n)
                    cpu[name]["call"].append(time.process_time() - c)
                    continue
                prefix = f"v{names.index(name)}"
                c = time.process_time()
                parts = BUILD[name](prefix, n)
                b = time.process_time()
                out = await j.persist_many(parts)
                e = time.process_time()
                assert not failures(out), failures(out)[:2]
                batch = validator.batch(parts)
                v = time.process_time()
                backend.statements.statement(batch.chunk(0, PIDS // 2), backend.writer_id, 0)
                backend.statements.statement(batch.chunk(PIDS // 2, PIDS), backend.writer_id, 0)
                s = time.process_time()
                row = cpu[name]
                row["build"].append(b - c)
                row["call"].append(e - b)
                row["batch"].append(v - e)
                row["params"].append(s - v)
            await asyncio.sleep(0)
    await conn.close()
    raw_ms = 1e3 * statistics.median(cpu["raw from values"]["call"][5:])
    print(f"raw from values: {raw_ms:.2f} ms client CPU per 1000 rows")
    for name in BUILD:
        m = {k: 1e3 * statistics.median(v[5:]) for k, v in cpu[name].items()}
        whole = m["build"] + m["call"]
        print(
            f"{name:<24} build {m['build']:.2f} + persist_many {m['call']:.2f} = {whole:.2f} ms ({whole / raw_ms:.2f} x raw);"
            f" inside: validator.batch {m['batch']:.2f}, params of 2 x 500 {m['params']:.2f}"
        )


if __name__ == "__main__":
    R = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    mode = sys.argv[2] if len(sys.argv) > 2 else "uvloop"
    with fresh_database() as dsn:
        if mode == "asyncio":
            print("asyncio, gc untouched")
            asyncio.run(main(dsn, R))
        else:
            print("uvloop, gc tuned (journal.runtime.run)")
            runtime.run(main(dsn, R))
