"""Messages between endpoints: JSON (orjson) bytes; no code generation.

A batch is a JSON header followed by the raw payloads: ``len(header)`` as 4 bytes (big endian),
the header, then every event's payload and metadata payload, in order, whose lengths the header
gives. Raw bytes rather than base64 inside the JSON: encoding and decoding payloads was a
sixth of a replicated batch's CPU time.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..replicated import ReplicatedEvent, ReplicationBatch
from ..serialization import Serialized
from ..vector_time import VectorTime
from .replicator import ReadRequest
from .versions import Application

_HEADER_LENGTH = 4


def _ser(s: Serialized | None, blobs: list[bytes]) -> list[Any] | None:
    if s is None:
        return None
    blobs.append(s.payload)
    return [s.ser_id, s.manifest, len(s.payload)]


class _Blob:
    """Reads the payloads after the header, in order."""

    def __init__(self, data: bytes, at: int) -> None:
        self.data = data
        self.at = at

    def take(self, v: list[Any] | None) -> Serialized | None:
        if v is None:
            return None
        end = self.at + int(v[2])
        if end > len(self.data):
            raise ValueError("replication batch truncated: payloads shorter than its header says")
        payload, self.at = self.data[self.at : end], end
        return Serialized(int(v[0]), str(v[1]), payload)


def encode_read(r: ReadRequest) -> bytes:
    return orjson.dumps(
        {
            "log": r.log_name, "after": r.after, "limit": r.limit, "target": r.target_location,
            "vv": r.target_vv.to_json(), "app": [r.target_application.name, r.target_application.version],
            "ids": [list(i) for i in r.ids], "stored": r.stored,
        }
    )  # fmt: skip


def decode_read(b: bytes) -> ReadRequest:
    d = orjson.loads(b)
    return ReadRequest(
        d["log"], int(d["after"]), int(d["limit"]), d["target"], VectorTime(d["vv"]), Application(*d["app"]),
        tuple((str(o), int(n)) for o, n in d.get("ids", ())),
        None if d.get("stored") is None else int(d["stored"]),
    )  # fmt: skip


def encode_batch(b: ReplicationBatch) -> bytes:
    blobs: list[bytes] = []
    header = orjson.dumps(
        {
            "source": b.source_location,
            "log": b.log_name,
            "last": b.last_scanned,
            "covered": [list(i) for i in b.covered],
            "events": [
                [e.persistence_id, _ser(e.event, blobs), e.origin_location, e.origin_seq_nr,
                 e.vector_time.to_json(), e.log_seq_nr, list(e.tags), _ser(e.metadata, blobs)]
                for e in b.events
            ],
        }
    )  # fmt: skip
    return b"".join((len(header).to_bytes(_HEADER_LENGTH, "big"), header, *blobs))


def decode_batch(b: bytes) -> ReplicationBatch:
    size = int.from_bytes(b[:_HEADER_LENGTH], "big")
    d = orjson.loads(b[_HEADER_LENGTH : _HEADER_LENGTH + size])
    blob = _Blob(b, _HEADER_LENGTH + size)
    take, of_clean = blob.take, VectorTime.of_clean
    events: list[ReplicatedEvent] = []
    append = events.append
    for pid, ev, origin, origin_seq, vt, pos, tags, meta in d["events"]:
        event = take(ev)
        if event is None:
            raise ValueError("replication batch malformed: an event without its payload")
        append(
            ReplicatedEvent(
                pid, event, origin, int(origin_seq), of_clean(vt) if type(vt) is dict else VectorTime(vt),
                int(pos), tuple(tags) if tags else (), take(meta) if meta is not None else None,
            )
        )  # fmt: skip
    covered = tuple((str(o), int(n)) for o, n in d.get("covered", ()))
    return ReplicationBatch(d["source"], d["log"], tuple(events), int(d["last"]), covered)
