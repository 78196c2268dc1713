"""Spark pipelines over the journal (the ``spark`` extra): read by slice range, decode, write back.

Importing this package does not import pyspark; the functions do, when called.
"""

from journal.errors import ProjectionBusy, SparkSetupError

from .backfill import BackfillResult, ReadModel, backfill
from .decode import decode_events, infer_schema, merge_schemas
from .environment import JdbcDriver, find_java, find_jdbc_driver, spark_session
from .export import export_parquet
from .jdbc import JdbcSource, jdbc_source
from .placement import SliceSource, placement, spark_ranges
from .reader import JOURNAL_COLUMNS, journal_predicates, read_journal
from .states import STATE_COLUMNS, decode_states, read_states, state_predicates
from .writer import WriteResult, drop_staging_tables, write_read_model

__all__ = [
    "JOURNAL_COLUMNS",
    "STATE_COLUMNS",
    "BackfillResult",
    "JdbcDriver",
    "JdbcSource",
    "ProjectionBusy",
    "ReadModel",
    "SliceSource",
    "SparkSetupError",
    "WriteResult",
    "backfill",
    "decode_events",
    "decode_states",
    "drop_staging_tables",
    "export_parquet",
    "find_java",
    "find_jdbc_driver",
    "infer_schema",
    "jdbc_source",
    "journal_predicates",
    "merge_schemas",
    "placement",
    "read_journal",
    "read_states",
    "spark_ranges",
    "spark_session",
    "state_predicates",
    "write_read_model",
]
