"""Snapshot conveniences: the completion handler, several snapshots per pid, fallback to older."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import asyncpg
import pytest

from journal import EntityRegistry, InvalidArgument, Journal, JournalSettings, SerializationError, open_journal
from journal.entities import SnapshotResult
from journal.serialization import SerializerRegistry
from tests.entity_fixtures import Counter


class Saver(Counter):
    """Records every snapshot result; refuses to restore a snapshot holding "broken"."""

    entity_type = "saver"
    results: list[SnapshotResult] = []

    def snapshot_state(self) -> Any:
        if self.state and self.state[-1] == "unserializable":
            return {"state": object()}
        return list(self.state)

    def restore_snapshot(self, snapshot: Any) -> list[Any]:
        if "broken" in snapshot:
            raise ValueError("cannot restore")
        return list(snapshot)

    def on_snapshot_saved(self, result: SnapshotResult) -> None:
        Saver.results.append(result)


async def test_completion_handler_gets_success_and_real_failure(journal: Journal) -> None:
    Saver.results = []
    async with EntityRegistry(journal) as reg:
        await reg.ask(Saver, "a", ("snapshot", "one"))
        await reg.ask(Saver, "a", ("snapshot", "unserializable"))
        await reg.ask(Saver, "a", ("add", "after"))  # the saves run in the background; wait:
    ok, failed = sorted(Saver.results, key=lambda r: r.seq_nr)
    assert ok == SnapshotResult("saver|a", 1) and ok.ok
    assert failed.seq_nr == 2 and not failed.ok
    assert isinstance(failed.error, SerializationError) and "object" in str(failed.error)
    snap = await journal.load_snapshot("saver|a")
    assert snap is not None and snap.seq_nr == 1 and snap.state == ["one"]  # the failure wrote nothing


async def test_several_snapshots_kept_up_to_the_maximum(dsn: str, settings: JournalSettings) -> None:
    from tests.conftest import truncate_all

    await truncate_all(dsn)
    keep3 = replace(settings, entities=replace(settings.entities, snapshots_per_emitter_max=3))
    async with open_journal(dsn, settings=keep3) as journal, EntityRegistry(journal) as reg:
        for i in range(5):
            await reg.ask(Saver, "b", ("snapshot", f"s{i}"))
    async with open_journal(dsn, settings=keep3) as journal:
        snaps = await journal.load_snapshots("saver|b")
        assert [s.seq_nr for s in snaps if not isinstance(s, Exception)] == [5, 4, 3]
        assert [len(s.state) for s in snaps if not isinstance(s, Exception)] == [5, 4, 3]
        newest = await journal.load_snapshot("saver|b")
        assert newest is not None and newest.seq_nr == 5  # the reference table: the newest only
        assert [s.seq_nr for s in await journal.load_snapshots("saver|b", limit=2)] == [5, 4]  # type: ignore[union-attr]
        with pytest.raises(InvalidArgument):
            await journal.save_snapshot("saver|b", 6, [], keep=0)
        await journal.delete_snapshot("saver|b")
        assert await journal.load_snapshots("saver|b") == []
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM snapshot_older") == 0
    finally:
        await conn.close()


async def test_recovery_falls_back_to_an_older_snapshot(dsn: str, settings: JournalSettings) -> None:
    from tests.conftest import truncate_all

    await truncate_all(dsn)
    keep2 = replace(settings, entities=replace(settings.entities, snapshots_per_emitter_max=2))
    async with open_journal(dsn, settings=keep2) as journal:
        async with EntityRegistry(journal) as reg:
            await reg.ask(Saver, "c", ("snapshot", "first"))
            await reg.ask(Saver, "c", ("add", "second"))
            await reg.ask(Saver, "c", ("snapshot", "broken"))  # newest snapshot cannot restore
            await reg.ask(Saver, "c", ("add", "last"))
        await journal.persist("saver|c", ["x"], expected_seq_nr=4)
        async with EntityRegistry(journal) as reg:
            # the older snapshot (seq 1) restores; events 2..5 are replayed after it
            assert await reg.ask(Saver, "c", ("read",)) == ["first", "second", "broken", "last", "x"]

    # an undecodable newest snapshot (unknown serializer id) also falls back
    class Odd:
        identifier = 4242

        def manifest(self, value: Any) -> str:
            return ""

        def to_bytes(self, value: Any) -> bytes:
            return b"odd"

        def from_bytes(self, payload: bytes, manifest: str) -> Any:
            return "odd"

    odd = SerializerRegistry()
    odd.register(Odd(), bytes)
    async with open_journal(dsn, settings=keep2, serializers=odd) as j2:
        await j2.save_snapshot("saver|c", 5, b"raw", keep=2)
    async with open_journal(dsn, settings=keep2) as journal:
        snaps = await journal.load_snapshots("saver|c")
        assert isinstance(snaps[0], SerializationError)
        async with EntityRegistry(journal) as reg:
            assert await reg.ask(Saver, "c", ("read",)) == ["first", "second", "broken", "last", "x"]
