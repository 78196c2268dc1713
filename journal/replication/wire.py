"""Messages between endpoints: JSON (orjson) bytes, payloads base64. No code generation."""

from __future__ import annotations

import base64
from typing import Any

import orjson

from ..serialization import Serialized
from .model import ReplicatedEvent, ReplicationBatch
from .replicator import ReadRequest
from .vector_time import VectorTime
from .versions import Application


def _ser(s: Serialized | None) -> list[Any] | None:
    return None if s is None else [s.ser_id, s.manifest, base64.b64encode(s.payload).decode()]


def _unser(v: list[Any] | None) -> Serialized | None:
    return None if v is None else Serialized(int(v[0]), str(v[1]), base64.b64decode(v[2]))


def encode_read(r: ReadRequest) -> bytes:
    return orjson.dumps(
        {
            "log": r.log_name, "after": r.after, "limit": r.limit, "target": r.target_location,
            "vv": r.target_vv.to_json(), "app": [r.target_application.name, r.target_application.version],
            "ids": [list(i) for i in r.ids],
        }
    )  # fmt: skip


def decode_read(b: bytes) -> ReadRequest:
    d = orjson.loads(b)
    return ReadRequest(
        d["log"], int(d["after"]), int(d["limit"]), d["target"], VectorTime(d["vv"]), Application(*d["app"]),
        tuple((str(o), int(n)) for o, n in d.get("ids", ())),
    )  # fmt: skip


def encode_batch(b: ReplicationBatch) -> bytes:
    return orjson.dumps(
        {
            "source": b.source_location,
            "log": b.log_name,
            "last": b.last_scanned,
            "covered": [list(i) for i in b.covered],
            "events": [
                [e.persistence_id, _ser(e.event), e.origin_location, e.origin_seq_nr, e.vector_time.to_json(),
                 e.log_seq_nr, list(e.tags), _ser(e.metadata)]
                for e in b.events
            ],
        }
    )  # fmt: skip


def decode_batch(b: bytes) -> ReplicationBatch:
    d = orjson.loads(b)
    events = []
    for pid, ev, origin, origin_seq, vt, pos, tags, meta in d["events"]:
        event = _unser(ev)
        assert event is not None
        events.append(
            ReplicatedEvent(pid, event, origin, int(origin_seq), VectorTime(vt), int(pos), tuple(tags), _unser(meta))
        )
    covered = tuple((str(o), int(n)) for o, n in d.get("covered", ()))
    return ReplicationBatch(d["source"], d["log"], tuple(events), int(d["last"]), covered)
