"""The Kafka records of a batch of events, built with as little per-record work as possible.

Each event becomes ``(key, value, headers)``: the key its persistence id, the value the publisher's
serializer's bytes, the headers ``pid``, ``seq_nr``, ``slice``, ``db_timestamp`` (ISO 8601) and
``manifest``. What repeats across events is encoded once and reused: the 1024 slice numbers, the
batch's timestamps (a write's events share one), the manifests of the event types. An event that
was read back as plain JSON (a dict or a list) is dumped as is: JSON read from the journal comes
back unchanged, so the journal serializer's round-trip check (a second parse) is skipped for it
(a dict orjson cannot dump goes the serializer's way; what JSON cannot hold unchanged, a tuple or a
NaN, no event decoded from stored JSON has).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import orjson

from journal.envelope import EventEnvelope
from journal.serialization import JsonSerializer

Serializer = Callable[[Any], bytes]
Headers = list[tuple[str, str | bytes | None]]
Record = tuple[bytes, bytes, Headers]

_JSON = JsonSerializer()
_SLICES = [str(s).encode() for s in range(1024)]


def json_value(event: Any) -> bytes:
    """The default value: the event as JSON, as the journal stores it."""
    if type(event) is dict or type(event) is list:
        try:
            return orjson.dumps(event)
        except orjson.JSONEncodeError:
            pass
    return _JSON.to_bytes(event)


class RecordBuilder:
    """Builds the records of batches; keeps the encodings that repeat (see the module's doc)."""

    def __init__(self, value: Serializer = json_value) -> None:
        self.value = value
        self._manifests: dict[type, bytes] = {}
        self._timestamps: dict[datetime, bytes] = {}

    def records(self, envelopes: Sequence[EventEnvelope]) -> list[Record]:
        if len(self._timestamps) > 10_000:
            self._timestamps.clear()
        stamps, manifests, value = self._timestamps, self._manifests, self.value
        out: list[Record] = []
        for e in envelopes:
            event = e.event
            pid = e.persistence_id.encode()
            ts = stamps.get(e.db_timestamp)
            if ts is None:
                ts = stamps[e.db_timestamp] = e.db_timestamp.isoformat().encode()
            manifest = manifests.get(type(event))
            if manifest is None:
                manifest = self._manifest(event)
            headers: Headers = [
                ("pid", pid), ("seq_nr", str(e.seq_nr).encode()), ("slice", _SLICES[e.slice]),
                ("db_timestamp", ts), ("manifest", manifest),
            ]  # fmt: skip
            out.append((pid, value(event), headers))
        return out

    def _manifest(self, event: Any) -> bytes:
        manifest = self._manifests[type(event)] = _JSON.manifest(event).encode()  # the same for every instance
        return manifest
