"""A location's database goes down under its running endpoint (a private server, crashed and
started again): the endpoint answers its peers' reads ``UNAVAILABLE`` with the cause, logs no
traceback, and replication resumes once the database is back."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

from endpoint_processes import EndpointProcess, free_address

from journal import JournalSettings, open_journal
from journal.postgres.migrations import upgrade
from tests.support.private_server import crash
from tests.support.waiting import wait_until

LOG = "Order"


async def test_peers_see_unavailable_while_a_locations_database_is_down(
    dsn: str, private_server: Any, tmp_path: Path
) -> None:
    from conftest import truncate_all

    await truncate_all(dsn)
    b_dsn = private_server.get_uri()
    await asyncio.to_thread(upgrade, b_dsn)
    addresses = {"A": free_address(), "B": free_address()}
    common = {"logs": [LOG], "retry_delay": 0.2, "failure_detection_limit": 2.0}
    a = EndpointProcess(tmp_path, {**common, "location": "A", "dsn": dsn, "listen": addresses["A"],
                                   "connections": [{"address": addresses["B"]}]})  # fmt: skip
    b = EndpointProcess(tmp_path, {**common, "location": "B", "dsn": b_dsn, "listen": addresses["B"]})
    settings = JournalSettings.load(env={}, dsn=b_dsn)
    try:
        a.start()
        b.start()
        await a.wait_ready()
        await b.wait_ready()
        async with open_journal(b_dsn, settings=settings, migrate=False) as jb:
            await jb.persist(f"{LOG}|1", [{"v": "before"}])

        async def a_has(n: int) -> bool:
            return int((await a.info())["logs"][LOG]["version_vector"].get("B", 0)) >= n

        await wait_until(lambda: a_has(1), 60, "A to replicate B's first event", every=0.1)
        await asyncio.to_thread(crash, private_server)

        async def causes_at_a() -> list[str]:
            (conn,) = (await a.info())["connections"]
            log = conn["logs"][LOG]
            return [*log["causes"], *log["recent_causes"]]

        async def reported() -> list[str]:
            return [c for c in await causes_at_a() if "B" in c and "database unavailable" in c]

        causes = await wait_until(reported, 30, "A to report B's database unavailable", every=0.1)
        assert all("UNAVAILABLE" in c for c in causes), causes
        assert not [c for c in await causes_at_a() if re.search(r"endpoint \S+: UNKNOWN", c)]
        assert "Traceback" not in b.log() and "ConnectionRefusedError" not in b.log(), b.log()[-3000:]

        await asyncio.to_thread(private_server.ensure_postgres_running)
        async with open_journal(b_dsn, settings=settings, migrate=False) as jb:
            await jb.persist(f"{LOG}|1", [{"v": "after"}])
        await wait_until(lambda: a_has(2), 60, "replication to resume", every=0.1)
    finally:
        a.stop()
        b.stop()
