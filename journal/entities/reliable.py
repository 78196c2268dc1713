"""Bookkeeping for ``persist_on_event`` and confirmed delivery (Eventuate's PersistOnEvent and
ConfirmedDelivery), one per entity instance, rebuilt by replay or loaded from a snapshot.

Events written for these carry *marks* in their metadata, keyed by sequence number like routes:
``{"on_event_of": {"8": 7}}`` (event 8 is a follow-up that event 7's handler asked for) and
``{"confirms": {"9": "d-7"}}`` (event 9 confirms delivery ``d-7``). An event's marks are read
before its handler runs, live or on replay, so a follow-up already in the journal is never
written again and a confirmed delivery is never sent again. Outstanding follow-ups and
unconfirmed deliveries go into the snapshot's metadata, so a snapshot never hides them.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..codec import Forgotten
from ..envelope import EventEnvelope
from ..errors import SerializationError
from ..serialization import SerializerRegistry

ON_EVENT_KEY = "on_event_of"
CONFIRMS_KEY = "confirms"
SNAPSHOT_KEY = "entity"
"""The key of the bookkeeping in a snapshot's metadata."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a destination receives: ``message`` from entity ``sender`` (its pid).

    ``attempt`` counts deliveries of ``delivery_id`` by this entity instance (1 = first; a
    restarted sender starts again at 1). Confirm by sending the sender a command whose handler
    calls ``persist_confirmation(event, delivery_id)``.
    """

    delivery_id: str
    sender: str
    message: Any
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class FollowUp:
    """An event that the handler of event ``trigger`` asked to persist."""

    trigger: int
    event: Any
    destinations: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Unconfirmed:
    destination: str
    message: Any
    seq_nr: int = 0
    """The event whose handler asked for the delivery (0: not known, from an older snapshot)."""


def mark_of(envelope: EventEnvelope, key: str) -> Any:
    """The mark ``key`` of this event (None when it has none)."""
    meta = envelope.metadata
    if not isinstance(meta, dict):
        return None
    marks = meta.get(key)
    if not isinstance(marks, dict):
        return None
    return marks.get(str(envelope.seq_nr))


def with_marks(
    metadata: dict[str, Any] | None, first_seq_nr: int, marks: Mapping[int, Mapping[str, Any]]
) -> dict[str, Any] | None:
    """``metadata`` of one persist call plus the marks of its events (index -> {key: value})."""
    if not marks:
        return metadata
    out: dict[str, Any] = dict(metadata or {})
    for index, mark in sorted(marks.items()):
        for key, value in mark.items():
            out.setdefault(key, {})[str(first_seq_nr + index)] = value
    return out


class Bookkeeping:
    """Follow-ups not yet seen in the journal and deliveries not yet confirmed."""

    def __init__(self) -> None:
        self.follow_ups: dict[int, list[FollowUp]] = {}
        self.in_flight: set[int] = set()
        """Triggers whose follow-ups are being written now."""
        self.unconfirmed: dict[str, Unconfirmed] = {}
        self.fresh: list[str] = []
        """Delivery ids asked for by events just written: sent at once, not at the next tick."""
        self.confirming: set[str] = set()
        """Delivery ids whose confirmation is being written (or its outcome resolved): not sent
        meanwhile, since the confirmation may already be stored."""

    def observe(self, envelope: EventEnvelope) -> None:
        """Read the marks of an event about to be applied."""
        trigger = mark_of(envelope, ON_EVENT_KEY)
        if trigger is not None:
            self.follow_ups.pop(int(trigger), None)
            self.in_flight.discard(int(trigger))
        confirmed = mark_of(envelope, CONFIRMS_KEY)
        if confirmed is not None:
            self.unconfirmed.pop(str(confirmed), None)

    def add_follow_up(self, follow_up: FollowUp) -> None:
        self.follow_ups.setdefault(follow_up.trigger, []).append(follow_up)

    def add_delivery(self, delivery_id: str, destination: str, message: Any, *, live: bool, seq_nr: int = 0) -> None:
        self.unconfirmed[delivery_id] = Unconfirmed(destination, message, seq_nr)
        if live:
            self.fresh.append(delivery_id)

    @property
    def has_follow_ups_to_write(self) -> bool:
        return any(t not in self.in_flight for t in self.follow_ups)

    def take_follow_ups(self) -> list[FollowUp]:
        """The follow-ups not being written yet, in trigger order; now marked in flight."""
        todo = sorted(t for t in self.follow_ups if t not in self.in_flight)
        self.in_flight.update(todo)
        return [f for t in todo for f in self.follow_ups[t]]

    def release(self) -> None:
        """A follow-up write failed: they may be taken again."""
        self.in_flight.clear()

    def take_fresh(self) -> list[str]:
        fresh = [d for d in self.fresh if d in self.unconfirmed]
        self.fresh = []
        return fresh

    # -- snapshots -----------------------------------------------------------------------------

    def to_metadata(self, serializers: SerializerRegistry, pid: str) -> dict[str, Any] | None:
        """Snapshot metadata holding what a snapshot's state alone would lose (None: nothing).
        The events and messages in it are sealed with ``pid``'s key when the journal encrypts
        (their keys loaded first), as the snapshot's state is: forgetting the subject reaches them."""
        if not self.follow_ups and not self.unconfirmed:
            return None
        return {
            SNAPSHOT_KEY: {
                "follow_ups": [
                    [f.trigger, _encode(serializers, f.event, pid), list(f.destinations)]
                    for t in sorted(self.follow_ups)
                    for f in self.follow_ups[t]
                ],
                "unconfirmed": [
                    [d, u.destination, _encode(serializers, u.message, pid), u.seq_nr]
                    for d, u in self.unconfirmed.items()
                ],
            }
        }

    def load_metadata(self, metadata: Any, serializers: SerializerRegistry, pid: str) -> None:
        """Take over what :meth:`to_metadata` stored (nothing when the snapshot has none); the
        keys of ``pid`` loaded first. What reads as Forgotten (the subject was forgotten) is
        dropped: a forgotten entity's pending outputs go with it."""
        self.follow_ups.clear()
        self.in_flight.clear()
        self.unconfirmed.clear()
        self.fresh = []
        part = metadata.get(SNAPSHOT_KEY) if isinstance(metadata, dict) else None
        if not isinstance(part, dict):
            return
        try:
            for trigger, event, dests in part.get("follow_ups", ()):
                value = _decode(serializers, event, pid)
                if type(value) is not Forgotten:
                    self.add_follow_up(FollowUp(int(trigger), value, tuple(dests)))
            for delivery_id, destination, message, *asked_by in part.get("unconfirmed", ()):
                value = _decode(serializers, message, pid)
                if type(value) is not Forgotten:
                    self.unconfirmed[str(delivery_id)] = Unconfirmed(
                        str(destination), value, int(asked_by[0]) if asked_by else 0
                    )
        except (TypeError, ValueError) as e:
            raise SerializationError(f"snapshot bookkeeping does not load: {e}") from e


def _encode(serializers: SerializerRegistry, value: Any, pid: str) -> list[Any]:
    s = serializers.serialize(value, what="a follow-up event or delivery in a snapshot", pid=pid)
    return [s.ser_id, s.manifest, base64.b64encode(s.payload).decode("ascii")]


def _decode(serializers: SerializerRegistry, encoded: Sequence[Any], pid: str) -> Any:
    ser_id, manifest, payload = encoded
    raw = base64.b64decode(payload)
    return serializers.deserialize(int(ser_id), str(manifest), raw, what="snapshot bookkeeping", pid=pid)
