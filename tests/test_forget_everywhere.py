"""Forget reaches every copy of a subject's data the library writes (issue 32): the events, their
tag rows, snapshots, the dead letters whose error and traceback quote the event (sealed with the
subject's key), and a stopped worker's error (stored without the handler's message). After
``forget``, a scan of every table of the database, all columns cast to text (and bytea in hex),
finds the subject's secret nowhere (as text, in hex or in base64)."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from journal import EntityRegistry, EventEnvelope, Forgotten, HandlerFailed, Journal, JournalSettings, open_journal
from journal.entities import Delivery
from journal.sealed_text import FORGOTTEN_TEXT, is_sealed
from projections import TagWorker, Worker
from projections.dead_letter_store import DeadLetterSql, opened
from projections.dead_letters import retry
from tests.reliable_fixtures import Sender
from tests.support.waiting import wait_until

DEAD = DeadLetterSql("public")
ROOT = Path(__file__).resolve().parent.parent


def enc(dsn: str) -> JournalSettings:
    return JournalSettings.load(
        env={}, dsn=dsn, encrypt=True, eventual_consistency_delay=0.0, lease_ttl=1.5, lease_renew_interval=0.3,
        handler_backoff=0.01, heartbeat_offset_interval=0.5, handler_attempts=2,
    )  # fmt: skip


async def validating(_conn: Any, env: EventEnvelope) -> None:
    """A handler whose validation error quotes the event's field (as pydantic's does)."""
    email = env.event["email"]
    if "secret" in email:
        raise ValueError(f"1 validation error for Customer\nemail\n  value is not an email [input_value={email!r}]")


def listed(dsn: str, name: str) -> str:
    """``projections dead-letters list NAME``, run as an operator runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOURNAL_")}
    env.update(JOURNAL_DSN=dsn, JOURNAL_CODEC_ENCRYPT="true", PYTHONPATH=str(ROOT), COLUMNS="200")
    out = subprocess.run(
        [sys.executable, "-m", "projections", "dead-letters", "list", name], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


async def tables_holding(conn: asyncpg.Connection, secret: str) -> list[str]:
    """Every table of the database (all schemas but the system's) with a row that holds ``secret``
    in any column: as text, as the hex that a bytea column casts to, or base64-encoded."""
    tables = await conn.fetch(
        "SELECT schemaname, tablename FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')"
    )
    assert len(tables) > 15, tables  # the journal's, the projections', the keys', replication's
    texts = [secret, *base64_forms(secret)]
    forms = texts + [t.encode().hex() for t in texts]  # a bytea column casts to hex
    found = []
    for schema, table in tables:
        q = f'SELECT count(*) FROM "{schema}"."{table}" t, unnest($1::text[]) AS f(form) '
        if await conn.fetchval(q + "WHERE strpos(t::text, form) > 0", forms):
            found.append(f"{schema}.{table}")
    return found


def base64_forms(secret: str) -> list[str]:
    """What ``secret`` looks like inside any base64 text, at each of the three alignments (the
    characters its edges share with their neighbours left out)."""
    out = []
    for k in range(3):
        encoded = base64.b64encode(b"\0" * k + secret.encode()).decode()
        out.append(encoded[4 if k else 0 : -4])
    return out


async def test_after_forget_no_table_holds_the_subjects_plaintext(journal: Journal, dsn: str) -> None:
    secret = f"ann-secret-{uuid.uuid4().hex[:8]}@example.com"
    settings = enc(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        async with open_journal(dsn, settings=settings) as j:
            await j.persist("Customer|ann", [{"email": secret}], tags=["customers"])
            await j.persist("Customer|bob", [{"email": "bob@example.com"}], tags=["customers"])
            await j.save_snapshot("Customer|ann", 1, {"email": secret})
            assert await tables_holding(conn, "bob@example.com") == []  # sealed where stored

            w = Worker(j, settings, "fe", "Customer", validating, "exactly-once", recovery="retry-and-dead-letter")
            task = asyncio.create_task(w.run())
            await wait_until(lambda: w.stats.dead_lettered == 1 or task.done(), 30, "the dead letter")
            w.stop()
            await task
            assert await retry(j, conn, DEAD, "fe", validating, "exactly-once")  # fails again: stored again
            stopping = Worker(j, settings, "fe-stop", "Customer", validating, "exactly-once", recovery="retry-and-fail")
            with pytest.raises(HandlerFailed) as failed:
                await asyncio.wait_for(stopping.run(), 60)
            assert secret in str(failed.value)  # the caller is told; projections status is not
            [status] = await conn.fetch("SELECT state, error FROM projection_worker WHERE projection_name = 'fe-stop'")
            assert status["state"] == "failed" and "ValueError (its message is in the worker's log" in status["error"]
            assert await tables_holding(conn, secret) == []
            [letter] = await DEAD.letters(conn, "fe")
            assert letter.attempts == 3 and is_sealed(letter.error) and is_sealed(letter.traceback)
            [readable] = await opened(j.serializers, [letter])
            assert secret in readable.error and secret in readable.traceback  # the operator reads it
            assert secret in listed(dsn, "fe")  # and so does `projections dead-letters list`

            assert await j.forget("Customer|ann") is True
            [readable] = await opened(j.serializers, await DEAD.letters(conn, "fe"))
            assert (readable.error, readable.traceback) == (FORGOTTEN_TEXT, FORGOTTEN_TEXT)
            assert FORGOTTEN_TEXT in listed(dsn, "fe") and secret not in listed(dsn, "fe")
            [event] = [e.event async for e in j.current_events_by_persistence_id("Customer|ann")]
            assert isinstance(event, Forgotten)
        assert await tables_holding(conn, secret) == []
        assert await tables_holding(conn, "Customer|ann")  # (the scan finds what is there in clear)
    finally:
        await conn.close()


async def test_a_tag_projections_dead_letter_is_sealed_too(journal: Journal, dsn: str) -> None:
    """A tag projection's dead letter quotes the event as an event projection's does: its error
    and traceback are sealed with the subject's key (a tag processor was made without the
    journal's serializers before its parts were shared with the slice ranges': in clear)."""
    secret = f"tag-secret-{uuid.uuid4().hex[:8]}@example.com"
    tag = f"vip{uuid.uuid4().hex[:6]}"
    settings = enc(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        async with open_journal(dsn, settings=settings) as j:
            await j.persist(f"Customer|{tag}", [{"email": secret}], tags=[tag])
            w = TagWorker(j, settings, f"fe-{tag}", tag, validating, "exactly-once", recovery="retry-and-dead-letter")
            task = asyncio.create_task(w.run())
            await wait_until(lambda: w.stats.dead_lettered == 1 or task.done(), 30, "the dead letter")
            w.stop()
            await task
            [letter] = await DEAD.letters(conn, f"fe-{tag}")
            assert letter.projection_key == f"tag:{tag}" and is_sealed(letter.error) and is_sealed(letter.traceback)
            [readable] = await opened(j.serializers, [letter])
            assert secret in readable.error  # the operator reads it
            assert await tables_holding(conn, secret) == []
    finally:
        await conn.close()


async def test_an_entitys_pending_deliveries_in_its_snapshot_are_sealed_and_forgotten(
    journal: Journal, dsn: str
) -> None:
    """A snapshot's metadata keeps the entity's unconfirmed deliveries (the message: event data);
    they are sealed with the entity's key, and dropped at recovery once it is forgotten."""
    secret = f"sender-secret-{uuid.uuid4().hex[:8]}"
    seen: list[Delivery] = []
    conn = await asyncpg.connect(dsn)
    try:
        async with open_journal(dsn, settings=enc(dsn)) as j:
            async with EntityRegistry(j) as reg:
                reg.add_destination("sink", seen.append)
                await reg.ask(Sender, "s9", ("send", secret))
                await reg.ask(Sender, "s9", ("snapshot",))
                await wait_until(lambda: seen, 10, "the first delivery")
            snap = await j.load_snapshot("sender|s9")
            assert snap is not None and snap.metadata["entity"]["unconfirmed"][0][:2] == ["d-1", "sink"]
            assert await tables_holding(conn, secret) == []
            seen.clear()
            async with EntityRegistry(j) as reg:  # recovers from the snapshot: delivers it again
                reg.add_destination("sink", seen.append)
                await reg.start(Sender, "s9")
                await wait_until(lambda: seen, 10, "the delivery after restart")
                assert seen[0].message == secret
            assert await j.forget("sender|s9") is True
            async with EntityRegistry(j) as reg:  # forgotten: nothing of it to deliver
                reg.add_destination("sink", seen.append)
                assert await reg.ask(Sender, "s9", ("unconfirmed",)) == []
    finally:
        await conn.close()
