"""Wait for a write (issue 36): a real worker process projects; a writer waits until the
projection has its write, then reads it from the read model. NOTIFY in the offset transaction,
a dropped listening connection, an unknown projection, another entity type, a timeout."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest
from projection_helpers import FAST_ENV, spawn_worker, stop

from journal import Journal
from journal.bulk import Written
from journal.errors import InvalidArgument, NotProjected, UnknownProjection
from journal.offsets import TimestampOffset
from journal.settings import JournalSettings
from projections.demo.cart import prepare
from projections.postgres_store import NOTIFIED_ROWS, offsets_channel
from projections.write_waits import WriteWaits, wait_processed
from tests.support.waiting import wait_until

ET, NAME = "WaitCart", "p-wait"
ITEM = {"type": "ItemAdded", "item": "sku-1", "qty": 1}


@pytest.fixture
async def conn(journal: Journal, dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    await prepare(c)
    await c.execute("TRUNCATE demo_cart_projected, demo_cart_view")
    yield c
    await c.close()


@pytest.fixture
async def worker(conn: asyncpg.Connection, journal: Journal, dsn: str) -> AsyncIterator[subprocess.Popen[bytes]]:
    """One worker process of projection NAME over ET, caught up on a first event."""
    await journal.persist(f"{ET}|first", [ITEM])
    proc = spawn_worker(dsn, NAME, ET, env={"JOURNAL_PROJECTION_GROUP_MAX_WAIT": "0.005"})
    try:
        await wait_until(lambda: conn.fetchval("SELECT count(*) FROM demo_cart_projected"), 60, "the worker to start")
        yield proc
    finally:
        stop([proc])


async def test_a_write_is_in_the_read_model_when_its_wait_returns(
    journal: Journal, conn: asyncpg.Connection, worker: subprocess.Popen[bytes]
) -> None:
    async with WriteWaits.open(journal) as waits:
        for i in range(40):
            pid = f"{ET}|{i % 7}"
            envs = await journal.persist(pid, [ITEM, ITEM])
            assert await waits.wait(NAME, envs, timeout=30)
            # read your own write: the read model has it the moment the wait returns
            n = await conn.fetchval("SELECT max(seq_nr) FROM demo_cart_projected WHERE persistence_id = $1", pid)
            assert n == envs[-1].seq_nr
        # several waits at once, on one listening connection, by envelope and by offset
        writes = await asyncio.gather(*(journal.persist(f"{ET}|many-{i}", [ITEM]) for i in range(20)))
        now = datetime.now(UTC)  # a TimestampOffset's seen names the write, as the CLI's --pid/--seq-nr
        done = await asyncio.gather(
            *(waits.wait(NAME, TimestampOffset(now, {w[0].persistence_id: 1}), timeout=30) for w in writes)
        )
        assert done == [True] * 20
        # already processed: True at once
        assert await waits.wait(NAME, writes[0], timeout=0)


async def test_the_offset_transaction_notifies_on_commit(
    journal: Journal, conn: asyncpg.Connection, worker: subprocess.Popen[bytes], dsn: str
) -> None:
    got: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(dsn)
    try:
        await listener.add_listener(offsets_channel("public"), lambda *a: got.put_nowait(a[3]))
        envs = await journal.persist(f"{ET}|notified", [ITEM])
        # the projection and the batch's (pid, seq_nr)s (heartbeat-only batches send nothing)
        assert json.loads(await asyncio.wait_for(got.get(), 30)) == [NAME, [[f"{ET}|notified", 1]]]
        # sent at commit: the offset row is visible when the notification arrives
        stored = await conn.fetchval(
            "SELECT max(seq_nr) FROM projection_timestamp_offset_store WHERE projection_name = $1"
            " AND persistence_id = $2", NAME, envs[0].persistence_id,
        )  # fmt: skip
        assert stored == 1
    finally:
        await listener.close()


async def test_a_wait_survives_its_listening_connection_being_terminated(
    journal: Journal, conn: asyncpg.Connection, worker: subprocess.Popen[bytes], dsn: str
) -> None:
    holder = await asyncpg.connect(dsn)
    try:
        async with WriteWaits.open(journal) as waits:
            # the handler's transaction cannot write the read model until the holder commits
            tx = holder.transaction()
            await tx.start()
            await holder.execute("LOCK TABLE demo_cart_projected IN ACCESS EXCLUSIVE MODE")
            envs = await journal.persist(f"{ET}|relisten", [ITEM])
            wait = asyncio.create_task(waits.wait(NAME, envs, timeout=60))
            await wait_until(lambda: NAME in waits._waiting, 10, "the wait to be registered")
            assert waits._listener is not None
            listener_pid = waits._listener.get_server_pid()
            assert await conn.fetchval("SELECT pg_terminate_backend($1)", listener_pid)
            await wait_until(
                lambda: waits._listener is not None and not waits._listener.is_closed()
                and waits._listener.get_server_pid() != listener_pid, 30, "listening again",
            )  # fmt: skip
            assert not wait.done()
            await tx.commit()
            assert await wait
            n = await conn.fetchval(
                "SELECT count(*) FROM demo_cart_projected WHERE persistence_id = $1", envs[0].persistence_id
            )
            assert n == 1
    finally:
        await holder.close()


async def test_faults_are_typed_errors_or_false_never_a_hang(
    journal: Journal, conn: asyncpg.Connection, worker: subprocess.Popen[bytes], settings: JournalSettings
) -> None:
    envs = await journal.persist(f"{ET}|faults", [ITEM])
    async with WriteWaits.open(journal) as waits:
        assert await waits.wait(NAME, envs, timeout=30)
        started = time.monotonic()
        with pytest.raises(UnknownProjection, match=r"unknown projection 'p-nope': known projections are .*'p-wait'"):
            await waits.wait("p-nope", envs, timeout=30)
        other = await journal.persist("OtherType|1", [ITEM])
        with pytest.raises(NotProjected, match=r"'OtherType\|1' is not processed by projection 'p-wait'"):
            await waits.wait(NAME, other, timeout=30)
        with pytest.raises(InvalidArgument, match="nothing to wait for"):
            await waits.wait(NAME, [], timeout=30)
        with pytest.raises(InvalidArgument, match="a SequenceOffset names no persistence id"):
            await waits.wait(NAME, envs[0].offset, timeout=30)  # type: ignore[arg-type]  # deliberately wrong
        assert time.monotonic() - started < 5, "the refusals did not wait"
        # an event the projection will not process in time: False at the timeout
        stop([worker])
        later = await journal.persist(f"{ET}|faults", [ITEM])
        started = time.monotonic()
        assert not await waits.wait(NAME, later, timeout=0.5)
        assert 0.5 <= time.monotonic() - started < 3
    # the one-shot form, over settings with a DSN
    assert await wait_processed(settings, NAME, envs, timeout=5)


def _cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "projections", "wait", *args, "--dsn", dsn],
        capture_output=True, text=True, timeout=60, env={**os.environ, **FAST_ENV},
    )  # fmt: skip


async def test_cli_wait(journal: Journal, worker: subprocess.Popen[bytes], dsn: str) -> None:
    envs = await journal.persist(f"{ET}|cli", [ITEM, ITEM, ITEM])
    ok = await asyncio.to_thread(_cli, dsn, NAME, "--pid", f"{ET}|cli", "--seq-nr", "3", "--timeout", "30")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"{NAME} has processed {ET}|cli #3 (")
    unknown = await asyncio.to_thread(_cli, dsn, "p-nope", "--pid", f"{ET}|cli", "--seq-nr", "1")
    assert (unknown.returncode, unknown.stderr.count("\n")) == (2, 1), unknown.stderr
    assert unknown.stderr.startswith("error: unknown projection 'p-nope'")
    other = await asyncio.to_thread(_cli, dsn, NAME, "--pid", "OtherType|1", "--seq-nr", "1")
    assert (other.returncode, other.stderr.count("\n")) == (2, 1), other.stderr
    assert "is not processed by projection 'p-wait'" in other.stderr
    late = await asyncio.to_thread(
        _cli, dsn, NAME, "--pid", envs[0].persistence_id, "--seq-nr", "9", "--timeout", "0.3"
    )
    assert (late.returncode, late.stderr.strip()) == (
        1, f"error: projection 'p-wait' has not processed {ET}|cli #9 within 0.3 s",
    )  # fmt: skip


async def test_a_batch_too_large_to_list_is_looked_up(
    journal: Journal, conn: asyncpg.Connection, worker: subprocess.Popen[bytes], dsn: str
) -> None:
    """A batch of more than NOTIFIED_ROWS pids notifies only the projection's name: the waits of
    that projection check the store, one query for all of them."""
    holder, listener = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    names_only: list[str] = []
    await listener.add_listener(
        offsets_channel("public"), lambda *a: names_only.append(a[3]) if json.loads(a[3]) == [NAME] else None
    )
    try:
        async with WriteWaits.open(journal) as waits:
            tx = holder.transaction()
            await tx.start()
            await holder.execute("LOCK TABLE demo_cart_projected IN ACCESS EXCLUSIVE MODE")
            await journal.persist(f"{ET}|before", [ITEM])  # the worker's batch blocks on it
            outcomes = await journal.persist_many([(f"{ET}|bulk-{i}", [ITEM]) for i in range(NOTIFIED_ROWS + 50)])
            parts = [o for o in outcomes if isinstance(o, Written)]  # what persist_many returned
            assert len(parts) == len(outcomes)
            waiting = [asyncio.create_task(waits.wait(NAME, o, 60)) for o in parts]
            await tx.commit()
            assert await asyncio.gather(*waiting) == [True] * len(outcomes)
            assert names_only, "no batch was too large to list"
    finally:
        await holder.close()
        await listener.close()
