"""Subprocess used by tests: ``python -m tests.tag_writer_worker DSN FIRST_TIME_BUCKET N_PIDS``.

Persists tagged events for N pids (``K|0`` ..) concurrently, forever, printing ``acked PID SEQ``
for every persist that returned; the test SIGKILLs it. Tag rows wait ``flush_interval`` before
they are written, so a kill finds events stored whose tag rows are not.
"""

from __future__ import annotations

import asyncio
import sys

from journal import JournalSettings, open_journal


async def main(dsn: str, first_bucket: str, n_pids: int) -> None:
    settings = JournalSettings.load(
        env={}, first_time_bucket=first_bucket, flush_interval=0.3, tag_write_timeout=10.0
    )  # fmt: skip
    async with open_journal(dsn, settings=settings) as j:

        async def writer(pid: str) -> None:
            i = 0
            while True:
                i += 1
                envs = await j.persist(pid, [{"i": i}], tags=["k"])
                print(f"acked {pid} {envs[0].seq_nr}", flush=True)

        await asyncio.gather(*(writer(f"K|{p}") for p in range(n_pids)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
