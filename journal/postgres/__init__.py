"""The PostgreSQL backend (asyncpg on every hot path; SQLAlchemy and Alembic for the schema).

Each module holds one concern (connections, writes, reads, slice reads, notifications, snapshots,
info, the tag, cleanup and replication stores, statements); ``backend.py`` puts them together.
SQL lives only here. The module map is in docs/architecture.md.
"""
