"""A read model computed twice: by Spark for the history, by an online handler afterwards.

``projections spark-backfill totals --entity-type acct --job examples.spark_totals:job``
fills ``totals`` up to the horizon; ``projections run totals --entity-type acct
--handler examples.spark_totals:handler`` continues from there. Events are JSON objects with an
``amount``.
"""

from __future__ import annotations

from typing import Any

TABLE = "totals"


def job(events: Any) -> Any:
    """Spark: one row per persistence id with the sum of amounts and the number of events."""
    from pyspark.sql import functions as F

    from projections.spark import ReadModel

    frame = events.groupBy("persistence_id").agg(
        F.sum("event.amount").cast("long").alias("total"), F.count("*").alias("n")
    )
    return ReadModel(frame=frame, table=TABLE, key=["persistence_id"])


async def handler(conn: Any, envelopes: Any) -> None:
    """Online (grouped mode): the same read model, one batch per transaction."""
    await conn.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} (persistence_id text PRIMARY KEY, total bigint, n bigint)")
    for env in envelopes:
        await conn.execute(
            f"INSERT INTO {TABLE} (persistence_id, total, n) VALUES ($1, $2, 1) ON CONFLICT (persistence_id) "
            f"DO UPDATE SET total = {TABLE}.total + EXCLUDED.total, n = {TABLE}.n + 1",
            env.persistence_id,
            env.event["amount"],
        )
