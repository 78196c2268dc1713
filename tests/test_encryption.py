"""Payload encryption, compression and crypto-shredding (issue 26), against the real database:
a forgotten subject's events and snapshots are unreadable after a restart and in a fresh process,
every other subject is intact, and readers get a Forgotten value instead of an exception."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from journal import (
    ConfigurationError,
    Entity,
    EntityRegistry,
    EventEnvelope,
    Forgotten,
    Journal,
    JournalSettings,
    SerializationError,
    SubjectForgotten,
    failures,
    open_journal,
)
from journal.codec import CODEC_SERIALIZER_ID
from projections import Worker
from tests.support.waiting import wait_until


@dataclass
class Address:
    street: str
    city: str


def enc(dsn: str, **more: Any) -> JournalSettings:
    return JournalSettings.load(env={}, dsn=dsn, encrypt=True, eventual_consistency_delay=0.0, **more)


def reader(dsn: str, *args: str) -> list[Any]:
    out = subprocess.run(
        [sys.executable, "-m", "tests.encryption_reader", dsn, *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


async def stored(conn: asyncpg.Connection, pid: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT event_ser_id, event_ser_manifest, event_payload FROM event_journal WHERE persistence_id = $1"
        " ORDER BY seq_nr",
        pid,
    )


async def test_a_forgotten_subject_is_unreadable_for_good_and_the_others_are_intact(journal: Journal, dsn: str) -> None:
    settings = enc(dsn)
    async with open_journal(dsn, settings=settings) as j:
        j.serializers.register_type(Address)
        for who in ("alice", "bob"):
            await j.persist(f"Person|{who}", [{"name": who}, Address(f"{who} street 1", "Ghent")], tags=["people"])
            await j.save_snapshot(f"Person|{who}", 2, {"name": who, "city": "Ghent"})
        conn = await asyncpg.connect(dsn)
        try:
            rows = await stored(conn, "Person|alice")
            assert [r[0] for r in rows] == [CODEC_SERIALIZER_ID] * 2  # what a JVM reader sees: opaque
            assert rows[1][1] == f"e|1|{__name__}:Address"  # the event's manifest stays readable
            assert all(b"alice" not in bytes(r[2]) for r in rows)
            assert [e.event async for e in j.current_events_by_persistence_id("Person|alice")] == [
                {"name": "alice"}, Address("alice street 1", "Ghent")
            ]  # fmt: skip
            listed = {(m.kind, m.name, m.sealed): m.rows for m in await j.stored_manifests()}
            assert listed == {("event", "", "e"): 2, ("event", f"{__name__}:Address", "e"): 2, ("snapshot", "", "e"): 2}
            assert await j.forget("Person|alice") is True
            assert await j.forget("Person|alice") is False  # forgotten already
            # this process, at once: every read path gives Forgotten, not an exception
            by_pid = [e.event async for e in j.current_events_by_persistence_id("Person|alice")]
            assert by_pid == [Forgotten("Person|alice", ""), Forgotten("Person|alice", f"{__name__}:Address")]
            sliced = {e.persistence_id: e.event async for e in j.current_events_by_slices("Person", 0, 1023)}
            assert isinstance(sliced["Person|alice"], Forgotten) and sliced["Person|bob"] == Address(
                "bob street 1", "Ghent"
            )
            tagged = [e.event async for e in j.current_events_by_tag("people")]
            assert sum(isinstance(e, Forgotten) for e in tagged) == 2 and len(tagged) == 4
            snap = await j.load_snapshot("Person|alice")
            assert snap is not None and isinstance(snap.state, Forgotten)
            # nothing more is written for a forgotten subject (refused before anything is written)
            with pytest.raises(SubjectForgotten):
                await j.persist("Person|alice", [{"name": "again"}])
            with pytest.raises(SubjectForgotten):
                await j.save_snapshot("Person|alice", 2, {"x": 1})
            assert await j.highest_seq_nr("Person|alice") == 2
            # the key row is a tombstone: no key material left in the database
            assert await conn.fetchval("SELECT data_key FROM encryption_key WHERE subject = 'Person|alice'") is None
        finally:
            await conn.close()
    # after a restart (a new journal, empty caches) and in a fresh process: the same
    async with open_journal(dsn, settings=settings) as again:
        assert all(
            [isinstance(e.event, Forgotten) async for e in again.current_events_by_persistence_id("Person|alice")]
        )
    alice, bob = await asyncio.to_thread(reader, dsn, "read", "Person|alice", "Person|bob")
    assert alice == {"pid": "Person|alice", "events": [{"forgotten": "Person|alice"}] * 2,
                     "snapshot": {"forgotten": "Person|alice"}}  # fmt: skip
    assert bob["events"] == [{"name": "bob"}, {"street": "bob street 1", "city": "Ghent"}]
    assert bob["snapshot"] == {"name": "bob", "city": "Ghent"}


async def test_a_subject_forgotten_elsewhere_stops_being_readable_within_the_cache_ttl(
    journal: Journal, dsn: str
) -> None:
    async with open_journal(dsn, settings=enc(dsn, key_cache_ttl=0.5)) as j:
        await j.persist("Person|carol", [{"name": "carol"}])
        assert [e.event async for e in j.current_events_by_persistence_id("Person|carol")] == [{"name": "carol"}]
        cli = [sys.executable, "-c", "from journal.cli import main; main()", "forget", "Person|carol", "--dsn", dsn]
        env = {**os.environ, "JOURNAL_CODEC_ENCRYPT": "true"}  # the writers' setting (the command refuses without)
        out = await asyncio.to_thread(subprocess.run, cli, capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0 and "forgot Person|carol" in out.stdout, out.stderr  # another process

        async def forgotten_here() -> bool:
            return all(
                [isinstance(e.event, Forgotten) async for e in j.current_events_by_persistence_id("Person|carol")]
            )

        await wait_until(forgotten_here, 10, "the cached key to expire and be checked again")


class Profile(Entity[list[Any]]):
    entity_type = "Person"

    def initial_state(self) -> list[Any]:
        return []

    async def on_command(self, command: Any) -> Any:
        if command == "read":
            return list(self.state)
        self.persist(command)
        return None

    def on_event(self, state: list[Any], event: Any) -> list[Any]:
        return [*state, "(forgotten)" if isinstance(event, Forgotten) else event]


async def test_entities_and_projections_handle_forgotten_events_and_go_on(journal: Journal, dsn: str) -> None:
    settings = enc(dsn, lease_ttl=1.5, lease_renew_interval=0.3, handler_backoff=0.01)
    async with open_journal(dsn, settings=settings) as j:
        for who in ("dave", "erin"):
            await j.persist(f"Person|{who}", [{"name": who}, {"city": "Ghent"}])
        await j.forget("Person|dave")
        async with EntityRegistry(j) as entities:
            assert await entities.ask(Profile, "dave", "read") == ["(forgotten)", "(forgotten)"]
            assert await entities.ask(Profile, "erin", "read") == [{"name": "erin"}, {"city": "Ghent"}]
        seen: list[Any] = []

        async def handler(_conn: Any, envs: Sequence[EventEnvelope]) -> None:
            seen.extend((e.persistence_id, type(e.event).__name__) for e in envs)

        worker = Worker(j, settings, "people", "Person", handler, "grouped")
        task = asyncio.create_task(worker.run())
        await wait_until(lambda: len(seen) == 4 or task.done(), 30, "the projection")
        await j.persist("Person|erin", [{"city": "Bruges"}])  # the projection went on past them
        await wait_until(lambda: len(seen) == 5 or task.done(), 30, "the projection after the forgotten events")
        worker.stop()
        await task
        assert sorted(seen) == sorted([("Person|dave", "Forgotten")] * 2 + [("Person|erin", "dict")] * 3)


async def test_compression_resolution_master_key_and_tampering(journal: Journal, dsn: str) -> None:
    big = {"text": "x" * 5000}
    async with open_journal(dsn, settings=enc(dsn, compress_above=1000)) as j:
        await j.persist("Doc|d1", [big, {"small": 1}], expected_seq_nr=0)
        await j.persist("Doc|d3", [{"small": 3}])
        # an interrupted write is resolved by comparing stored bytes: sealing is deterministic
        again = await j.resolve_persist("Doc|d1", [big, {"small": 1}], expected_seq_nr=0)
        assert [e.seq_nr for e in again] == [1, 2]
    conn = await asyncpg.connect(dsn)
    try:
        rows = await stored(conn, "Doc|d1")
        assert [r[1] for r in rows] == ["ze|1|", "e|1|"] and len(rows[0][2]) < 200
        # a payload moved to another subject's row does not authenticate
        await conn.execute(
            "UPDATE event_journal SET event_payload = $1 WHERE persistence_id = 'Doc|d3' AND seq_nr = 1",
            bytes(rows[1][2]),
        )
    finally:
        await conn.close()
    async with open_journal(dsn, settings=enc(dsn)) as j:
        with pytest.raises(SerializationError, match="does not authenticate"):
            _ = [e.event async for e in j.current_events_by_persistence_id("Doc|d3")]
    async with open_journal(dsn, settings=enc(dsn)) as j:  # bulk writes are sealed too
        out = await j.persist_many([("Doc|b1", [{"n": 1}]), ("Doc|b2", [b"raw", {"n": 2}])])
        assert not failures(out)
        assert [e.event async for e in j.current_events_by_persistence_id("Doc|b2")] == [b"raw", {"n": 2}]
    conn = await asyncpg.connect(dsn)
    try:
        assert {r[0] for r in await stored(conn, "Doc|b2")} == {CODEC_SERIALIZER_ID}
    finally:
        await conn.close()
    # compression alone: no keys, and a journal without a codec still reads it
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn, compress_above=1000)) as j:
        await j.persist("Doc|d2", [big])
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as j:
        assert [e.event async for e in j.current_events_by_persistence_id("Doc|d2")] == [big]
        with pytest.raises(SerializationError, match="no key store"):
            _ = [e.event async for e in j.current_events_by_persistence_id("Doc|d1")]
        with pytest.raises(ConfigurationError, match="does not encrypt"):
            await j.forget("Doc|d1")


async def test_data_keys_wrapped_with_a_master_key(journal: Journal, dsn: str) -> None:
    import base64
    import os

    master = base64.b64encode(os.urandom(32)).decode()
    async with open_journal(dsn, settings=enc(dsn, master_key=master)) as j:
        await j.persist("Person|frank", [{"name": "frank"}])
    conn = await asyncpg.connect(dsn)
    try:
        wrapped = await conn.fetchval("SELECT data_key FROM encryption_key WHERE subject = 'Person|frank'")
        assert len(wrapped) == 12 + 64 + 16  # nonce, key, tag: not the raw key
    finally:
        await conn.close()
    async with open_journal(dsn, settings=enc(dsn, master_key=master)) as j:
        assert [e.event async for e in j.current_events_by_persistence_id("Person|frank")] == [{"name": "frank"}]
    other = base64.b64encode(os.urandom(32)).decode()
    async with open_journal(dsn, settings=enc(dsn, master_key=other)) as j:
        with pytest.raises(ConfigurationError, match="master key"):
            _ = [e.event async for e in j.current_events_by_persistence_id("Person|frank")]
