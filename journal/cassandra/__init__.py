"""The Cassandra backend (the reference's tag-view design), behind the same Journal interface.

Needs the ``cassandra`` extra (the DataStax ``cassandra-driver``). CQL lives only here, in the
``.cql`` files of this package.
"""
