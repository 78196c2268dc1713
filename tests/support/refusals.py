"""The database refuses some rows a number of times (a real BEFORE INSERT trigger), so a test can
make one particular write fail while the others succeed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import asyncpg

_DROP = """
DROP TRIGGER IF EXISTS sj_test_refuse ON event_journal;
DROP FUNCTION IF EXISTS sj_test_refuse();
DROP SEQUENCE IF EXISTS sj_test_refusals;
"""


@contextlib.asynccontextmanager
async def refusing(
    dsn: str, persistence_id: str, payload_contains: str, times: int = 1
) -> AsyncIterator[asyncpg.Connection]:
    """Rows of ``persistence_id`` whose payload contains the text are refused ``times`` times
    (the first ones); yields a connection on which ``SELECT last_value FROM sj_test_refusals``
    counts the matching rows tried."""
    conn = await asyncpg.connect(dsn)
    await conn.execute(_DROP)
    pid = persistence_id.replace("'", "''")
    like = "%" + payload_contains.replace("'", "''").replace("%", "") + "%"
    await conn.execute(f"""
CREATE SEQUENCE sj_test_refusals;
CREATE FUNCTION sj_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.persistence_id = '{pid}' AND convert_from(NEW.event_payload, 'UTF8') LIKE '{like}'
     AND nextval('sj_test_refusals') <= {int(times)} THEN
    RAISE EXCEPTION 'the database refuses this row (test)';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER sj_test_refuse BEFORE INSERT ON event_journal FOR EACH ROW EXECUTE FUNCTION sj_test_refuse();
""")
    try:
        yield conn
    finally:
        await conn.execute(_DROP)
        await conn.close()
