"""The SQL of the demo's read model (the application's own tables, not the journal's).

A projection's read model belongs to the application; the demo keeps its statements here, named,
so that the handler and the verification read as Python.
"""

from __future__ import annotations

READ_MODEL_DDL = """
CREATE TABLE IF NOT EXISTS demo_cart_projected (
  entity_type TEXT NOT NULL, persistence_id TEXT NOT NULL, seq_nr BIGINT NOT NULL,
  db_timestamp TIMESTAMPTZ NOT NULL, projected_at TIMESTAMPTZ NOT NULL);
CREATE INDEX IF NOT EXISTS demo_cart_projected_idx ON demo_cart_projected (entity_type);
CREATE TABLE IF NOT EXISTS demo_cart_view (
  persistence_id TEXT PRIMARY KEY, entity_type TEXT NOT NULL, quantity BIGINT NOT NULL,
  events BIGINT NOT NULL, checked_out BOOLEAN NOT NULL);
"""

INSERT_PROJECTED = """INSERT INTO demo_cart_projected (entity_type, persistence_id, seq_nr, db_timestamp, projected_at)
SELECT u.e, u.p, u.n, u.t, clock_timestamp() FROM unnest($1::text[], $2::text[], $3::bigint[], $4::timestamptz[])
  AS u(e, p, n, t)"""
"""One row per projected event: (entity_type, persistence_id, seq_nr, db_timestamp) arrays."""

UPSERT_VIEW = """INSERT INTO demo_cart_view (persistence_id, entity_type, quantity, events, checked_out)
SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bool[])
ON CONFLICT (persistence_id) DO UPDATE SET quantity = demo_cart_view.quantity + EXCLUDED.quantity,
  events = demo_cart_view.events + EXCLUDED.events,
  checked_out = demo_cart_view.checked_out OR EXCLUDED.checked_out"""
"""Adds a batch's per-cart deltas to the view."""

COUNT_PROJECTED = "SELECT count(*) FROM demo_cart_projected WHERE entity_type = $1"
PROJECTED_KEYS = "SELECT persistence_id, seq_nr FROM demo_cart_projected WHERE entity_type = $1"
VIEW_ROWS = "SELECT * FROM demo_cart_view WHERE entity_type = $1"

LATENCIES = """SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM projected_at - db_timestamp)) p50,
  percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM projected_at - db_timestamp)) p99,
  max(extract(epoch FROM projected_at - db_timestamp)) mx
FROM demo_cart_projected WHERE entity_type = $1"""
"""Commit of an event to commit of its read-model row: p50, p99, max in seconds."""

LATENCIES_SPLIT = """SELECT db_timestamp < $2 steady,
  percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM projected_at - db_timestamp)) p50,
  percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM projected_at - db_timestamp)) p99,
  max(extract(epoch FROM projected_at - db_timestamp)) mx
FROM demo_cart_projected WHERE entity_type = $1 GROUP BY 1"""
"""As :data:`LATENCIES`, for the events committed before $2 (steady state: ``steady`` true) and
from $2 on (across the kill, the takeover and the rescale)."""

NOW = "SELECT clock_timestamp()"
"""The database's clock (event timestamps are the database's)."""
