"""Decoding JSON-serialized events (serializer id 1) into typed Spark columns.

The payload bytes are parsed with Spark's ``from_json`` against a schema: one given for all
events, one per event type (the row's ``event_ser_manifest``; the schemas are merged into one
struct whose fields are the union, so every row has the same column type), or one inferred
from a sample of the payloads. Rows of other serializers keep a null ``event``; with a
:class:`~.payloads.PayloadReader`, payloads are first read as the journal reads them
(decrypted, decompressed, deserialized, upcast) in Spark's Python workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from journal.codec import CODEC_SERIALIZER_ID
from journal.errors import InvalidArgument
from journal.serialization import JSON_SERIALIZER_ID

from .payloads import PayloadReader

ENVELOPE_COLUMNS = (
    "persistence_id",
    "entity_type",
    "slice",
    "seq_nr",
    "db_timestamp",
    "writer",
    "tags",
)


def merge_schemas(schemas: Mapping[str, Any]) -> Any:
    """One StructType holding the fields of every event type's schema.

    Raises:
        InvalidArgument: two event types declare the same field with different types.
    """
    from pyspark.sql.types import StructType

    fields: dict[str, Any] = {}
    for manifest, schema in schemas.items():
        if not isinstance(schema, StructType):
            raise InvalidArgument(f"schema of event type {manifest!r} must be a StructType")
        for f in schema.fields:
            prev = fields.get(f.name)
            if prev is not None and prev.dataType != f.dataType:
                raise InvalidArgument(
                    f"field {f.name!r} is {prev.dataType.simpleString()} in one event type and "
                    f"{f.dataType.simpleString()} in {manifest!r}: rename one of them"
                )
            fields[f.name] = f
    return StructType(list(fields.values()))


def infer_schema(df: Any, column: str, *, sample: int = 1000, ser_id_column: str | None = None) -> Any:
    """The JSON schema of up to ``sample`` payloads of ``column`` (an empty struct when none)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    rows = df
    if ser_id_column is not None:
        rows = rows.where(F.col(ser_id_column) == JSON_SERIALIZER_ID)
    texts = rows.where(F.col(column).isNotNull()).select(F.col(column).cast("string").alias("j")).limit(sample)
    collected = [r["j"] for r in texts.collect()]
    if not collected:
        return StructType([])
    spark = df.sparkSession
    inferred = spark.read.json(spark.sparkContext.parallelize(collected, 1)).schema
    return StructType([f for f in inferred.fields if f.name != "_corrupt_record"])


def decode_events(
    df: Any,
    schema: Any | Mapping[str, Any] | None = None,
    *,
    metadata_schema: Any | None = None,
    sample: int = 1000,
    payloads: PayloadReader | None = None,
) -> Any:
    """Envelope columns plus ``event_type`` (the manifest), ``event`` and ``metadata`` structs,
    ``forgotten`` and ``part``.

    ``schema``: a StructType for every event, a mapping of event type (manifest) to StructType,
    or None to infer from ``sample`` payloads. ``metadata_schema`` likewise for metadata (None:
    inferred). ``df`` is what :func:`read_journal` returns (with the payload columns).
    ``payloads``: read the payloads as the journal does (its codec, serializers, upcasters:
    :class:`~projections.spark.payloads.PayloadReader`); then ``event_type`` is the upcast
    manifest, a row an upcaster split is one row per ``part``, and a forgotten subject's row has
    ``forgotten`` true and a null ``event``. Without it, JSON payloads are parsed as stored and
    a sealed (encrypted or compressed) payload fails the job with a line saying so.
    Use ``.select("event.*")`` to flatten the event fields.
    """
    from pyspark.sql import functions as F

    needed = {"event_ser_id", "event_ser_manifest", "event_payload", "meta_ser_id", "meta_payload"}
    missing = sorted(needed - set(df.columns))
    if missing:
        raise InvalidArgument(f"decode_events needs the journal columns {missing}")
    if payloads is not None:
        df = payloads.open(df)
        text, readable = F.col("event_json"), F.col("event_json").isNotNull()
        event_schema = _event_schema(df, schema, "event_json", None, sample)
    else:
        text, readable = F.col("event_payload").cast("string"), F.col("event_ser_id") == JSON_SERIALIZER_ID
        event_schema = _event_schema(df, schema, "event_payload", "event_ser_id", sample)
        df = df.select(
            "*", F.col("event_ser_manifest").alias("event_type"), F.lit(False).alias("forgotten"),
            F.lit(0).alias("part"),
        )  # fmt: skip
    if metadata_schema is None:
        metadata_schema = infer_schema(df, "meta_payload", sample=sample, ser_id_column="meta_ser_id")

    def parsed(payload: Any, ok: Any, struct: Any) -> Any:
        if not struct.fields:  # nothing to decode (no JSON payloads): a null column, not struct<>
            return F.lit(None).cast("string")
        return F.when(ok, F.from_json(payload, struct, {"mode": "PERMISSIVE"}))

    event = parsed(text, readable, event_schema)
    if payloads is None:  # a sealed payload read as stored would be a silent null
        event = F.when(F.col("event_ser_id") == CODEC_SERIALIZER_ID, F.raise_error(F.lit(SEALED))).otherwise(event)
    keep = [c for c in ENVELOPE_COLUMNS if c in df.columns]
    return df.select(
        *keep,
        "event_type",
        event.alias("event"),
        parsed(F.col("meta_payload").cast("string"), F.col("meta_ser_id") == JSON_SERIALIZER_ID, metadata_schema).alias(
            "metadata"
        ),
        "forgotten",
        "part",
    )


SEALED = (
    "sealed payload: the journal encrypts or compresses its events; decode them with its codec "
    "(decode_events(..., payloads=PayloadReader.of(journal, source)); the CLI does it when codec settings are set)"
)
"""The failure of a sealed row decoded without the journal's codec."""


def _event_schema(df: Any, schema: Any, column: str, ser_id_column: str | None, sample: int) -> Any:
    if schema is None:
        return infer_schema(df, column, sample=sample, ser_id_column=ser_id_column)
    if isinstance(schema, Mapping):
        return merge_schemas(schema)
    return schema
