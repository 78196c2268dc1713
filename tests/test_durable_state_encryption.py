"""Durable state on an encrypting journal (issue 34, item 5): state payloads sealed with the
subject's key as events are, a forgotten subject's state reads as Forgotten (by id and by slices)
and takes no new write, and the other subjects are intact."""

from __future__ import annotations

import asyncpg
import pytest

from journal import Forgotten, JournalSettings, SubjectForgotten, open_journal
from journal.codec import CODEC_SERIALIZER_ID
from journal.durable_state import DeletedState, UpdatedState
from tests.conftest import truncate_all


async def test_state_payloads_are_sealed_and_a_forgotten_subject_reads_as_forgotten(dsn: str) -> None:
    await truncate_all(dsn)
    settings = JournalSettings.load(env={}, dsn=dsn, encrypt=True, eventual_consistency_delay=0.0)
    async with open_journal(dsn, settings=settings) as j:
        store = j.durable_state()
        await store.upsert("Profile|ann", 1, {"email": "ann@example.com"})
        await store.upsert("Profile|ann", 2, {"email": "ann@example.org"})
        written = await store.upsert_many([("Profile|bob", 1, {"email": "bob@example.com"}), ("Profile|cy", 1, [1])])
        assert [w.revision for w in written] == [1, 1]  # type: ignore[union-attr]
        await store.delete("Profile|cy", 2)
        conn = await asyncpg.connect(dsn)
        try:
            rows = {
                r[0]: r
                for r in await conn.fetch("SELECT persistence_id, state_ser_id, state_payload FROM durable_state")
            }
        finally:
            await conn.close()
        for pid in ("Profile|ann", "Profile|bob"):
            assert rows[pid]["state_ser_id"] == CODEC_SERIALIZER_ID
            assert b"example" not in rows[pid]["state_payload"]
        assert rows["Profile|cy"]["state_ser_id"] == 0  # a tombstone stays the plugin's
        got = await store.get("Profile|ann")
        assert got is not None and (got.revision, got.value) == (2, {"email": "ann@example.org"})

        assert await j.forget("Profile|ann")
        gone = await store.get("Profile|ann")
        assert gone is not None and gone.revision == 2 and type(gone.value) is Forgotten
        with pytest.raises(SubjectForgotten):
            await store.upsert("Profile|ann", 3, {"email": "again@example.com"})
        changes = {c.persistence_id: c async for c in store.current_changes_by_slices("Profile", 0, 1023)}
        assert type(changes["Profile|ann"]) is UpdatedState and type(changes["Profile|ann"].value) is Forgotten
        assert changes["Profile|bob"].value == {"email": "bob@example.com"}  # type: ignore[union-attr]
        assert type(changes["Profile|cy"]) is DeletedState
    async with open_journal(dsn, settings=settings) as j:  # a fresh process's cache: the same
        store = j.durable_state()
        gone = await store.get("Profile|ann")
        assert gone is not None and type(gone.value) is Forgotten
        bob = await store.get("Profile|bob")
        assert bob is not None and bob.value == {"email": "bob@example.com"}
        await store.delete("Profile|ann", 3)  # a forgotten subject's state can still be deleted
        assert (await store.get("Profile|ann")).deleted  # type: ignore[union-attr]
