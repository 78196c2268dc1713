"""Replicated event logs between locations (issue 14); see docs/replication.md."""
