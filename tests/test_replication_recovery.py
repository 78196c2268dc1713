"""Disaster recovery refuses local writes from every writer, in every process, until it completes.

A location whose ``recover()`` has not succeeded yet (here: its only peer is unreachable, so
recovery fails and must be retried) refuses local writes to its replicated logs at the
database: the library's own ``persist``/``persist_many``/``persist_in`` in this process and in
another process, and a plain SQL INSERT (what a JVM service sends). Replicated writes pass, and
a successful recovery lifts the guard.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator

import asyncpg
import pytest
from conftest import truncate_all
from endpoint_processes import free_address
from replication_helpers import location_databases

from journal import Write
from journal.errors import JournalUnavailable, LocalWritesRefused
from journal.postgres.dsn import asyncpg_dsn
from journal.replication.config import EndpointConfig
from journal.replication.endpoint import ReplicationEndpoint

LOG = "Stock"

SECOND_PROCESS = """
import asyncio, json, sys
import asyncpg
from journal import JournalSettings, Write, open_journal
from journal.postgres.dsn import asyncpg_dsn

async def main(dsn):
    out = {}
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn), migrate=False) as j:
        for name, call in (
            ("persist", lambda: j.persist("Stock|p2", [{"n": 1}])),
            ("other_log", lambda: j.persist("Other|p2", [{"n": 1}])),
        ):
            try:
                await call()
                out[name] = "written"
            except Exception as e:
                out[name] = type(e).__name__
        results = await j.persist_many([Write("Stock|m1", [{"n": 1}]), Write("Stock|m2", [{"n": 2}])])
        out["persist_many"] = [type(r).__name__ for r in results]
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        await conn.execute(
            "INSERT INTO event_journal (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,"
            " event_ser_manifest, event_payload, writer) VALUES (1, 'Stock', 'Stock|jvm', 1, now(), 1, '', '{}', 'jvm')"
        )
        out["sql_insert"] = "written"
    except asyncpg.PostgresError as e:
        out["sql_insert"] = e.sqlstate
    finally:
        await conn.close()
    print(json.dumps(out))

asyncio.run(main(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def dbs(server_dsn: str) -> Iterator[dict[str, str]]:
    with location_databases(server_dsn, ["A", "B"]) as d:
        yield d


async def second_process(dsn: str) -> dict[str, object]:
    """Local writes of every kind from another process; what each one got."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SECOND_PROCESS, dsn, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    async with asyncio.timeout(120):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-2000:]
    result: dict[str, object] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def count(dsn: str, entity_type: str) -> int:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    try:
        return int(await conn.fetchval("SELECT count(*) FROM event_journal WHERE entity_type = $1", entity_type))
    finally:
        await conn.close()


async def test_every_local_writer_is_refused_until_recovery_completes(dbs: dict[str, str]) -> None:
    for db in dbs.values():
        await truncate_all(db)
    addresses = {n: free_address() for n in "AB"}
    a_cfg = {"location": "A", "dsn": dbs["A"], "listen": addresses["A"], "logs": [LOG], "retry_delay": 0.2,
             "connections": [{"address": addresses["B"]}]}  # fmt: skip
    b_cfg = {"location": "B", "dsn": dbs["B"], "listen": addresses["B"], "logs": [LOG], "retry_delay": 0.2}
    async with ReplicationEndpoint(EndpointConfig.from_dict(a_cfg)) as a:
        await a.journal.persist(f"{LOG}|before", [{"n": 0}])
        with pytest.raises(JournalUnavailable):  # B is not running: recovery cannot complete
            await a.recover()
        assert await a.store.guard_installed()
        with pytest.raises(LocalWritesRefused, match="being recovered"):
            await a.journal.persist(f"{LOG}|p1", [{"n": 1}])
        conn = await asyncpg.connect(asyncpg_dsn(dbs["A"]))
        try:
            tr = conn.transaction()
            await tr.start()
            with pytest.raises(LocalWritesRefused):
                await a.journal.persist_in(conn, f"{LOG}|p1", [{"n": 1}])
            await tr.rollback()
        finally:
            await conn.close()
        got = await second_process(dbs["A"])
        assert got == {
            "persist": "LocalWritesRefused",
            "other_log": "written",  # a log that is not replicated is not recovered
            "persist_many": ["LocalWritesRefused", "LocalWritesRefused"],
            "sql_insert": "SJ014",
        }
        assert await count(dbs["A"], LOG) == 1  # nothing of the refused writes

    async with ReplicationEndpoint(EndpointConfig.from_dict(b_cfg)) as b:
        await b.journal.persist(f"{LOG}|at-b", [{"n": 2}])
        async with ReplicationEndpoint(EndpointConfig.from_dict(a_cfg)) as a:
            with pytest.raises(LocalWritesRefused):  # still refused after a restart
                await a.journal.persist(f"{LOG}|p1", [{"n": 1}])
            await a.recover()
            assert ("B", 1) in await a.store.event_ids(LOG)  # the replicated write passed the guard
            assert not await a.store.guard_installed()
            await a.journal.persist(f"{LOG}|p1", [{"n": 1}])
            got = await second_process(dbs["A"])
            assert got["persist"] == "written" and got["sql_insert"] == "written"
            assert got["persist_many"] == ["Written", "Written"]
    assert await count(dbs["A"], LOG) == 7


async def test_many_writes_in_one_batch_are_refused_together(dbs: dict[str, str]) -> None:
    """A group-commit batch mixing a recovering log and another: only the recovering log's calls fail."""
    await truncate_all(dbs["A"])
    cfg = {"location": "A", "dsn": dbs["A"], "listen": free_address(), "logs": [LOG], "retry_delay": 0.2,
           "connections": [{"address": free_address()}]}  # fmt: skip
    async with ReplicationEndpoint(EndpointConfig.from_dict(cfg)) as a:
        with pytest.raises(JournalUnavailable):
            await a.recover()
        out = await a.journal.persist_many([Write(f"{LOG}|x", [{"n": 1}]), Write("Other|x", [{"n": 1}])])
        assert [type(r).__name__ for r in out] == ["LocalWritesRefused", "Written"]
        # the optimistic insert (every part names expected_seq_nr) is refused the same way
        known = [Write(f"{LOG}|y", [{"n": 1}], 0), Write("Other|y", [{"n": 1}], 0), Write(f"{LOG}|z", [{"n": 1}], 0)]
        out = await a.journal.persist_many(known)
        assert [type(r).__name__ for r in out] == ["LocalWritesRefused", "Written", "LocalWritesRefused"]
        assert await count(dbs["A"], LOG) == 0
        await a.store.end_recovery([LOG])  # what a completed recovery does
        assert not await a.store.guard_installed()
