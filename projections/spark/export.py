"""Exporting the journal to Parquet for analytics, partitioned by slice range or by date."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from journal.errors import InvalidArgument
from journal.ids import NUMBER_OF_SLICES

PartitionBy = Literal["slice_range", "date"]


def slice_range_label(slice_column: Any, partitions: int) -> Any:
    """A column ``"0000-0127"``: the slice range (of ``partitions`` ranges) a row's slice is in."""
    from pyspark.sql import functions as F

    step = NUMBER_OF_SLICES // partitions
    lo = (F.floor(slice_column / step) * step).cast("int")
    return F.concat(
        F.lpad(lo.cast("string"), 4, "0"),
        F.lit("-"),
        F.lpad((lo + step - 1).cast("string"), 4, "0"),
    )


def export_parquet(
    df: Any,
    out: Path | str,
    *,
    partition_by: PartitionBy = "slice_range",
    partitions: int = 8,
    overwrite: bool = False,
) -> Path:
    """Write ``df`` (journal rows, decoded or not) under ``out`` as Parquet.

    ``slice_range``: one directory per slice range (``slice_range=0000-0127``), matching the
    reader's partitions; ``date``: one per UTC day of ``db_timestamp`` (``date=2024-05-01``).
    Without ``overwrite`` an existing ``out`` is refused.
    """
    from pyspark.sql import functions as F

    if partition_by not in ("slice_range", "date"):
        raise InvalidArgument(f"partition_by must be 'slice_range' or 'date', got {partition_by!r}")
    if partitions < 1 or NUMBER_OF_SLICES % partitions:
        raise InvalidArgument(f"partitions must divide {NUMBER_OF_SLICES}, got {partitions!r}")
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise InvalidArgument(f"{out} exists and is not empty: choose another --out or pass --overwrite")
    if partition_by == "slice_range":
        if "slice" not in df.columns:
            raise InvalidArgument("partitioning by slice range needs the 'slice' column")
        df = df.withColumn("slice_range", slice_range_label(F.col("slice"), partitions))
    else:
        if "db_timestamp" not in df.columns:
            raise InvalidArgument("partitioning by date needs the 'db_timestamp' column")
        df = df.withColumn("date", F.to_date(F.col("db_timestamp")))
    df.write.mode("overwrite" if overwrite else "errorifexists").partitionBy(partition_by).parquet(str(out))
    return out
