"""Reading payloads in Spark's Python workers the way the journal reads them: through its codec
(decryption with each subject's key, decompression), its serializers and its upcasters.

A :class:`PayloadReader` is made on the driver from an open journal and shipped to the workers
(``rdd.mapPartitions``): the journal's registry without its codec, the ``subject_of`` function
and the master key. The keys are read by Spark itself, from the ``encryption_key`` table of the
journal's (home) database over JDBC, joined to the rows by subject, and unwrapped in the worker,
a chunk of rows at a time; a worker's codec holds only its chunk's keys.

Each row becomes one row per event it reads as (an upcaster may split one into several, numbered
by ``part``) with the event's data as JSON text (``event_json``) under its upcast manifest
(``event_type``). A row of a forgotten subject keeps ``event_json`` null and has ``forgotten``
true, with its event type (stored in clear beside the ciphertext). A row the journal cannot read
fails the Spark job, as it fails a reader of the journal: never a silent null.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from journal.codec import CODEC_SERIALIZER_ID, Forgotten, MasterKey, PayloadCodec
from journal.journal import Journal
from journal.serialization import SerializerRegistry, dump_json

from .jdbc import JdbcSource

CHUNK_ROWS = 1000
"""Rows of a worker whose keys are unwrapped and loaded at once."""

OPENED_COLUMNS = ("event_type", "event_json", "forgotten", "part")
"""What :meth:`PayloadReader.open` puts in place of the event's payload columns."""


class _ChunkKeys:
    """The key store of one chunk of rows: the keys Spark joined to them (None: forgotten)."""

    def __init__(self, keys: dict[str, bytes | None]) -> None:
        self.keys = keys

    async def data_keys(self, subjects: Sequence[str], *, create: bool) -> dict[str, bytes | None]:
        return {s: self.keys[s] for s in subjects if s in self.keys}

    async def forget(self, subject: str) -> bool:
        raise NotImplementedError("a Spark worker does not forget subjects")


@dataclass(frozen=True)
class PayloadReader:
    """What a Spark worker needs to read the journal's payloads (see the module docstring)."""

    serializers: SerializerRegistry
    """The journal's registry (serializers, types, upcasters) without its codec."""
    subject_of: Callable[[str], str] | None
    """Whose key encrypts a pid's payloads; None: the journal does not encrypt."""
    master_key: str | None
    """``codec.master_key``: the stored keys are wrapped with it (None: stored as they are)."""
    keys: JdbcSource
    """The database holding the ``encryption_key`` table (the journal's home database)."""

    @classmethod
    def of(cls, journal: Journal, keys: JdbcSource) -> PayloadReader:
        registry = copy.copy(journal.serializers)
        registry.use_codec(None)  # the copy's; the workers make theirs from the joined keys
        codec = journal.serializers.codec
        subject_of = codec.subject_of if codec is not None and codec.encrypts else None
        return cls(registry, subject_of, journal.settings.codec.master_key, keys)

    def open(self, df: Any) -> Any:
        """``df`` (journal rows with the event payload columns) with the payload columns
        replaced by :data:`OPENED_COLUMNS`, one row per event read."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import BooleanType, IntegerType, StringType, StructField, StructType

        payload = ("event_ser_id", "event_ser_manifest", "event_payload")
        keep = [c for c in df.columns if c not in payload]
        rows = df.select(*keep, *payload)
        if self.subject_of is not None:
            subject_of = self.subject_of
            subject = F.udf(lambda pid: subject_of(pid), StringType())(F.col("persistence_id"))
            stored = rows.sparkSession.read.jdbc(
                url=self.keys.url, table=self.keys.table("encryption_key"), properties=self.keys.with_properties()
            ).select(F.col("subject").alias("_subject"), F.col("data_key").alias("_data_key"), F.lit(True).alias("_r"))
            rows = rows.withColumn("_subject", subject).join(stored, "_subject", "left")
            rows = rows.select(*keep, *payload, "_subject", "_data_key", "_r")
        else:
            rows = rows.select(*keep, *payload, F.lit(None).cast("string"), F.lit(None).cast("binary"), F.lit(None))
        fields = [f for f in df.schema.fields if f.name in keep]
        out = StructType([
            *fields, StructField("event_type", StringType()), StructField("event_json", StringType()),
            StructField("forgotten", BooleanType()), StructField("part", IntegerType()),
        ])  # fmt: skip
        n = len(keep)
        return rows.sparkSession.createDataFrame(rows.rdd.mapPartitions(lambda it: self._rows(it, n)), out)

    def _rows(self, rows: Iterable[Any], n: int) -> Iterator[tuple[Any, ...]]:
        it = iter(rows)
        while chunk := list(islice(it, CHUNK_ROWS)):
            registry = self._registry(chunk, n)
            for row in chunk:
                envelope = tuple(row[:n])
                ser_id, manifest, payload = row[n : n + 3]
                pid = row["persistence_id"]
                read = registry.stored_data(ser_id, manifest, bytes(payload), what=f"event of {pid!r}", pid=pid)
                if type(read) is Forgotten:
                    yield (*envelope, read.manifest, None, True, 0)
                    continue
                for part, (m, data) in enumerate(read):  # type: ignore[arg-type]
                    yield (*envelope, m, dump_json(data).decode(), False, part)

    def _registry(self, chunk: list[Any], n: int) -> SerializerRegistry:
        """The registry with a codec holding this chunk's keys, unwrapped here: a subject whose
        ``encryption_key`` row has no key is forgotten; one without a row has no key stored
        (its rows fail to read, as they do in the journal)."""
        if self.subject_of is None:
            return self.serializers
        master = MasterKey.from_base64(self.master_key) if self.master_key else None
        keys: dict[str, bytes | None] = {}
        for row in chunk:
            subject, stored, has_row = row[n + 3 : n + 6]
            if row[n] != CODEC_SERIALIZER_ID or not has_row or subject in keys:
                continue
            raw = None if stored is None else bytes(stored)
            keys[subject] = master.unwrap(subject, raw) if master and raw is not None else raw
        codec = PayloadCodec(_ChunkKeys(keys), subject_of=self.subject_of, cache_size=len(keys) + 1)
        asyncio.run(codec.load([row["persistence_id"] for row in chunk if row[n] == CODEC_SERIALIZER_ID], create=False))
        self.serializers.use_codec(codec)
        return self.serializers
