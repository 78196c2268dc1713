"""replication indexes that cost nothing to a journal that does not replicate

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23

Migration 0005 indexed (entity_type, log_seq_nr) on every row, so every write paid for an index
entry, also in a journal that never replicates (its rows keep log_seq_nr NULL forever). Here:

- ``event_journal_log_idx`` becomes partial, WHERE log_seq_nr IS NOT NULL: only events that are
  in a replicated log (stamped or replicated) are in it; reading a log by position uses it.
- ``event_journal_origin_idx``: a unique partial index on the event's identity in its log,
  (entity_type, origin_location, origin_seq_nr) WHERE origin_location IS NOT NULL. A target
  drops a replicated event it already stored by this exact identity (not by its version vector,
  which can cover an event that a filter kept from it on one path), and the database makes a
  second copy impossible.

Finding a replicated log's events that are not yet stamped uses a per-log partial index that
the replication endpoint creates for its own logs (``event_journal_unstamped_*``), so only
locations that replicate, and only for the logs they replicate, pay for it. No column changes:
event_journal stays column-compatible with the reference DDL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("event_journal_log_idx", table_name="event_journal")
    op.create_index(
        "event_journal_log_idx",
        "event_journal",
        ["entity_type", "log_seq_nr"],
        postgresql_where=sa.text("log_seq_nr IS NOT NULL"),
    )
    op.create_index(
        "event_journal_origin_idx",
        "event_journal",
        ["entity_type", "origin_location", "origin_seq_nr"],
        unique=True,
        postgresql_where=sa.text("origin_location IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("event_journal_origin_idx", table_name="event_journal")
    op.drop_index("event_journal_log_idx", table_name="event_journal")
    op.create_index("event_journal_log_idx", "event_journal", ["entity_type", "log_seq_nr"])
