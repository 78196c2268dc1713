"""A journal over several PostgreSQL databases by slice range (docs/scaling-out.md).

:class:`~.backend.PartitionedBackend` composes one PostgreSQL backend per database and routes
every operation by slice; :mod:`.layout` is the partition map; :mod:`.move` moves a slice range
to another database while the journal runs.
"""
