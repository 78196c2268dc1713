"""The optimistic insert: a batch whose every call names its ``expected_seq_nr``.

When the client already knows every sequence number, the general insert's per-row lookup of
the stored highest, its RETURNING and its grouping are work done only to report what the
client knows. This statement instead:

- inserts every event with the seq_nr the client computed, relying on the primary key
  ``(persistence_id, seq_nr)`` to refuse a call whose ``expected_seq_nr`` is stale;
- checks, per call, with one index probe, that ``expected_seq_nr`` is the stored highest (the
  lowest stored row at or above it is exactly it, or there is none when it is 0): this catches
  a gap, and a stale 0 after the pid's first events were deleted, which the key cannot;
- stamps its rows by :mod:`.timestamp_rule`, with ``prev`` the newest stored event of any of its
  pids (one base for the statement; the n-th row gets base + (n - 1) µs), and returns only the
  first row's timestamp and the number of calls that failed the check.

If the check fails nothing is inserted; if a row is refused the statement rolls back. Either
way nothing of the batch is written and the caller falls back to the general insert, which
isolates the failing calls (rare: a conflict). So each call stays atomic and conflict-checked
on its own, as with the general statement.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backend import WriteRequest
from ..columns import WriteColumns
from ..serialization import JSON_SERIALIZER_ID
from .statements import Statements, notify_groups
from .timestamp_rule import CLOCK, settle, stamp

_ROWS = """unnest($1::text[], $2::int[], $3::bigint[], $4::bytea[], $6::text[], $8::int[], $9::text[],
              $10::int[], $11::text[], $12::bytea[])
    WITH ORDINALITY AS t(persistence_id, slice, seq_nr, payload, entity_type, ser_id, ser_manifest,
                         meta_ser_id, meta_ser_manifest, meta_payload, n)"""

# the calls to check: from the event arrays when every call has one event, else their own arrays
_CALLS_OF_ONE_EVENT = "unnest($1::text[], $3::bigint[]) AS c0(persistence_id, seq_nr)"
_CALLS = "unnest($13::text[], $14::bigint[]) AS c0(persistence_id, seq_nr)"


class KnownSeqInsert:
    """Statement and parameters of the optimistic insert (see the module docstring).

    Parameters: per-event arrays $1 pid, $2 slice, $3 seq_nr, $4 payload, $6 entity type (empty:
    every row is $7), $8 serializer id (empty: JSON), $9 manifest (empty: ''), $10-$12 metadata
    (empty: none); $5 the writer id; with calls of several events, $13/$14 each call's pid and
    first seq_nr; with notifications, the last parameter is the notification payloads.
    """

    def __init__(self, sql: Statements, *, notify: bool) -> None:
        self._notify = notify
        self._channel = sql.channel
        self.one_event = self._statement(sql.ej, _CALLS_OF_ONE_EVENT, notify_param="$13")
        self.many_events = self._statement(sql.ej, _CALLS, notify_param="$15")

    @staticmethod
    def accepts(requests: Sequence[WriteRequest]) -> bool:
        """Every call names its expected_seq_nr and carries no tags (tag rows need RETURNING)."""
        for r in requests:
            if r.expected_seq_nr is None or r.tags:
                return False
        return True

    def _statement(self, ej: str, calls: str, *, notify_param: str) -> str:
        notify = (
            f", CASE WHEN bad = 0 THEN (SELECT count(pg_notify('{self._channel}', g))"
            f" FROM unnest({notify_param}::text[]) g) END"
            if self._notify
            else ""
        )
        return f"""
WITH {CLOCK}, chk AS (
  SELECT count(*) FILTER (WHERE COALESCE(f.seq_nr, 0) <> c.expected) AS bad, max(f.db_timestamp) AS prev
  FROM (SELECT c0.persistence_id, c0.seq_nr - 1 AS expected FROM {calls}) c
  LEFT JOIN LATERAL (
    SELECT e.seq_nr, e.db_timestamp FROM {ej} e
    WHERE e.persistence_id = c.persistence_id AND e.seq_nr >= c.expected ORDER BY e.seq_nr LIMIT 1
  ) f ON true
), ins AS (
  INSERT INTO {ej} (slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id,
    event_ser_manifest, event_payload, deleted, writer, meta_ser_id, meta_ser_manifest, meta_payload)
  SELECT t.slice, COALESCE(t.entity_type, $7::text), t.persistence_id, t.seq_nr, {stamp("chk.prev", "t.n")},
    COALESCE(t.ser_id, {JSON_SERIALIZER_ID}), COALESCE(t.ser_manifest, ''), t.payload, false, $5::text,
    t.meta_ser_id, t.meta_ser_manifest, t.meta_payload
  FROM chk, {_ROWS}
  WHERE chk.bad = 0
  RETURNING 1
)
SELECT {stamp("prev", "1")} AS ts, bad, {settle("ins")} AS settled{notify} FROM chk"""

    def statement(self, batch: Sequence[WriteRequest] | WriteColumns, writer: str) -> tuple[str, tuple[Any, ...]]:
        """The statement and its parameters for ``batch`` (requests :meth:`accepts`-ed, or
        columns), built in one pass; arrays whose every element is the default are sent empty."""
        if isinstance(batch, WriteColumns):
            return self._columns(batch, writer)
        requests = batch
        if all([len(r.events) == 1 for r in requests]):
            return self._one_event_each(requests, writer)
        pids: list[str] = []
        slices: list[int] = []
        seqs: list[int] = []
        payloads: list[bytes] = []
        ser_ids: list[int] = []
        manifests: list[str] = []
        first = requests[0]
        entity_type = first.entity_type
        one_entity_type = plain = True
        meta = many = False
        for r in requests:
            evs = r.events
            if r.entity_type != entity_type:
                one_entity_type = False
            if r.metadata is not None:
                meta = True
            if len(evs) == 1:
                ev = evs[0]
                pids.append(r.persistence_id)
                slices.append(r.slice)
                seqs.append(r.expected_seq_nr + 1)  # type: ignore[operator]  # accepts(): not None
                payloads.append(ev.payload)
                ser_ids.append(ev.ser_id)
                manifests.append(ev.manifest)
                if ev.ser_id != JSON_SERIALIZER_ID or ev.manifest:
                    plain = False
            else:
                many = True
                n = len(evs)
                base: int = r.expected_seq_nr  # type: ignore[assignment]  # accepts(): not None
                pids.extend([r.persistence_id] * n)
                slices.extend([r.slice] * n)
                seqs.extend(range(base + 1, base + n + 1))
                for ev in evs:
                    payloads.append(ev.payload)
                    ser_ids.append(ev.ser_id)
                    manifests.append(ev.manifest)
                    if ev.ser_id != JSON_SERIALIZER_ID or ev.manifest:
                        plain = False
        entity_types: list[str] = []
        if not one_entity_type:
            entity_types = [r.entity_type for r in requests for _ in r.events]
        meta_ids: list[int | None] = []
        meta_manifests: list[str | None] = []
        meta_payloads: list[bytes | None] = []
        if meta:
            metas = [r.metadata for r in requests for _ in r.events]
            meta_ids = [m.ser_id if m else None for m in metas]
            meta_manifests = [m.manifest if m else None for m in metas]
            meta_payloads = [m.payload if m else None for m in metas]
        if plain:
            ser_ids, manifests = [], []
        params: tuple[Any, ...] = (
            pids, slices, seqs, payloads, writer, entity_types, entity_type, ser_ids, manifests,
            meta_ids, meta_manifests, meta_payloads,
        )  # fmt: skip
        if many:
            params += ([r.persistence_id for r in requests], [r.expected_seq_nr + 1 for r in requests])  # type: ignore[operator]
        if self._notify:
            params += (notify_groups([r.slice for r in requests], [r.entity_type for r in requests]),)
        return (self.many_events if many else self.one_event), params

    def _one_event_each(self, requests: Sequence[WriteRequest], writer: str) -> tuple[str, tuple[Any, ...]]:
        """The group commit's commonest batch (one event per call): the requests transposed
        with ``zip`` (a loop in C) rather than a comprehension per column."""
        n = len(requests)
        pids, entity_types, slices, expected, events, _tags, metas = zip(*requests, strict=True)
        ser_ids, manifests, payloads = zip(*[e for (e,) in events], strict=True)
        if ser_ids.count(JSON_SERIALIZER_ID) == n and manifests.count("") == n:
            ser_ids = manifests = ()
        et = entity_types[0]
        notify = (notify_groups(slices, entity_types),) if self._notify else ()
        if entity_types.count(et) == n:
            entity_types = ()
        meta_ids: tuple[int | None, ...] = ()
        meta_manifests: tuple[str | None, ...] = ()
        meta_payloads: tuple[bytes | None, ...] = ()
        if metas.count(None) != n:
            meta_ids = tuple(m.ser_id if m else None for m in metas)
            meta_manifests = tuple(m.manifest if m else None for m in metas)
            meta_payloads = tuple(m.payload if m else None for m in metas)
        params: tuple[Any, ...] = (
            pids, slices, [e + 1 for e in expected], payloads, writer, entity_types, et, ser_ids, manifests,
            meta_ids, meta_manifests, meta_payloads, *notify,
        )  # fmt: skip
        return self.one_event, params

    def _columns(self, c: WriteColumns, writer: str) -> tuple[str, tuple[Any, ...]]:
        et = c.entity_types[0]
        entity_types = [] if c.entity_types.count(et) == len(c.entity_types) else c.entity_types
        ser_ids = [] if c.ser_ids.count(JSON_SERIALIZER_ID) == len(c.ser_ids) else c.ser_ids
        params: tuple[Any, ...] = (
            c.persistence_ids, c.slices, [e + 1 for e in c.expected_seq_nrs], c.payloads, writer,
            entity_types, et, ser_ids, [], [], [], [],
        )  # fmt: skip
        if self._notify:
            params += (notify_groups(c.slices, c.entity_types),)
        return self.one_event, params
