"""The horizon's fallback when the reader cannot see other roles' transaction starts."""

from __future__ import annotations

import logging
import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from slice_helpers import LateWriter, collect, request

from journal import Journal, JournalSettings, open_journal


def _as_user(dsn: str, user: str) -> str:
    parts = urlsplit(dsn)
    host = parts.netloc.split("@")[-1]
    return urlunsplit(parts._replace(netloc=f"{user}@{host}"))


async def test_writer_start_invisible_falls_back_to_previous_check(
    journal: Journal, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    role = f"sj_reader_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN")
        await admin.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        await admin.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {role}")
        limited = _as_user(dsn, role)
        try:
            probe = await asyncpg.connect(limited)
            await probe.close()
        except Exception as e:  # e.g. password auth on this server
            pytest.skip(f"cannot connect as a second role here: {e}")
        settings = JournalSettings.load(env={}, dsn=limited)
        caplog.set_level(logging.INFO, logger="journal.query.horizon")
        async with open_journal(limited, settings=settings, migrate=False) as reader:
            await journal.persist("role|before", [1])
            h1 = await reader.horizon()
            late = LateWriter(journal, dsn)
            rows = await late.begin_and_write([request(journal, "role|late", ["late"])])
            late_ts = rows[0]["db_timestamp"]
            await journal.persist("role|after", [2])
            h2 = await reader.horizon()
            # the writer's xact_start is NULL for this role: bounded by the previous check
            assert h2 == h1 <= late_ts
            assert any("not visible" in r.getMessage() for r in caplog.records)
            got = [e.persistence_id for e in await collect(reader.current_events_by_slices("role", 0, 1023))]
            assert got == ["role|before"]
            await late.commit()
            got = [e.persistence_id for e in await collect(reader.current_events_by_slices("role", 0, 1023))]
            assert got == ["role|before", "role|late", "role|after"]
    finally:
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
        await admin.execute(f"DROP OWNED BY {role}")
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()
