"""The INSERT of a :class:`~journal.write_batch.WriteBatch`: its SQL and its parameters.

One statement writes a whole batch. Per call it reads the pid's newest stored event (one index
descent; from the call's ``expected_seq_nr`` on when every call names one), checks the call's
``expected_seq_nr`` against it (a call that names none appends after it), and numbers the call's
events after it. When every call passes, every event is inserted,
stamped by :mod:`.timestamp_rule` with ``prev`` the newest stored event of any of the batch's pids
(one base for the statement; the n-th row gets base + (n - 1) µs); tagged calls get their tag
rows in the same statement. When any call fails the check, nothing is inserted and the statement
names those calls: the caller reports them as conflicts and sends the rest again. So each call
stays atomic and conflict-checked on its own. A row the database refuses (a racing writer's
primary key, a trigger) fails the statement: nothing of the batch is written.

It returns one row: the first row's timestamp, the number of calls that failed the check and
their positions (1-based), the previous highest sequence number of each call that appended (so
the caller knows where it landed), and the settle column (the statement ends once the clock has
passed its per-row steps).

A batch of one call of one untagged event (a lone ``persist``) takes a statement of its own with
scalar parameters (:meth:`WriteStatements._lone_sql`): one INSERT ... SELECT whose FROM items are
the owner check with the clock (one scan of ``slice_partition``) and the probe, its result in its
RETURNING, no row when its call fails the check (:func:`failed_calls` reads either answer).
Measured part by part (``benchmarks/write_breakdown.py --only lone``), it costs the server about
1.28 x a bare single-row INSERT (the earlier form with a CTE and a ``UNION ALL`` branch for the
conflict 1.40 x); the batch statement's shape (CTEs for the check, the insert and the result, and
a slice array to unnest for the owner check) cost one row about 15 % more.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

from orjson import dumps as _dumps

from ..serialization import JSON_SERIALIZER_ID
from ..write_batch import WriteBatch
from .statements import Statements, notify_groups
from .tag_statements import TagStatements
from .timestamp_rule import MICROSECOND, clock, clock_of_one, settle, stamp

_COLUMNS = """slice, entity_type, persistence_id, seq_nr, db_timestamp, event_ser_id, event_ser_manifest,
    event_payload, deleted, writer, tags, meta_ser_id, meta_ser_manifest, meta_payload"""

_CALL_COLUMNS = "persistence_id, slice, entity_type, expected, tags_json, meta_ser_id, meta_ser_manifest, meta_payload"
_EVENT_COLUMNS = "payload_end, payload_length, ser_id, ser_manifest"


def _ints(param: str, pg_type: str) -> str:
    """The array of a column of ints (or None) sent as one JSON text (:func:`_json`):
    ``[1,null,3]`` read by PostgreSQL's array input once its brackets are braces."""
    return f"translate({param}::text, '[]', '{{}}')::{pg_type}[]"


_CALL_FUNCTIONS = (
    f"json_array_elements_text($1::json), unnest({_ints('$2', 'int')}), json_array_elements_text($3::json),"
    f" unnest({_ints('$5', 'bigint')}), json_array_elements_text($6::json), unnest($7::int[]), unnest($8::text[]),"
    " unnest($9::bytea[])"
)
"""The per-call columns as functions of ``ROWS FROM`` (``_CALL_COLUMNS``)."""
_EVENT_FUNCTIONS = (
    f"unnest({_ints('$15', 'int')}), unnest({_ints('$16', 'int')}), unnest({_ints('$11', 'int')}),"
    " json_array_elements_text($12::json)"
)
"""The per-event columns as functions of ``ROWS FROM`` (``_EVENT_COLUMNS``): where each payload
ends in $10 and its length, its serializer id and manifest."""


def highest(pid: str, ej: str, expected: str | None) -> str:
    """The newest stored row of a pid (seq_nr, db_timestamp): one index descent. When the call
    names its ``expected`` sequence number, only the rows from it on are looked at (the newest of
    them must be ``expected`` itself): the scan then reads that one index entry, not all of the
    pid's entries on its leaf page."""
    at_least = f" AND e.seq_nr >= {expected}" if expected else ""
    return (
        f"SELECT e.seq_nr, e.db_timestamp FROM {ej} e WHERE e.persistence_id = {pid}{at_least}"
        " ORDER BY e.seq_nr DESC LIMIT 1"
    )


class WriteStatements:
    """The statements of this module for one schema, and their parameters for a batch.

    Parameters of the batch statement. Per call: $1 pid, $2 slice, $3 entity type (empty: every
    call is $4), $5 expected_seq_nr (NULL, or an empty array: append), $6 tags as JSON (empty:
    none), $7-$9 metadata (empty: none). Per event: $10 the payloads one after the other, $11
    serializer id (empty: JSON), $12 manifest (empty: ''). $13 the writer id, $14 its partition
    map epoch (the database's owner check of the batch's slices, :func:`.timestamp_rule.clock`),
    $15 where each payload ends in $10 and $16 its length. Then, in this order and only where
    they apply: the notification payloads, the tag bucket size in milliseconds (tagged batches),
    and per event its call and its position in it (1-based; batches with a call of several
    events). A column whose every element would be the default is sent empty: ``ROWS FROM``
    pads it with NULLs.

    The columns of ints and strs go as one JSON text each (:func:`_json`), the payloads as one
    bytea: asyncpg's array encoder checks every element against ``collections.abc`` types in
    Python, about 0.3 ms of client CPU per 1000 elements and column, more than checking and
    serializing the parts; PostgreSQL reads an int column with its array input and a str column
    with ``json_array_elements_text`` (``benchmarks/profiles/columns.py`` measures both sides).
    The metadata columns (empty unless a call carries metadata) stay arrays.
    """

    def __init__(self, sql: Statements, *, notify: bool, bucket_millis: int) -> None:
        self._ej = sql.t("event_journal")
        self._schema = sql.schema
        self._channel = sql.channel
        self._tags = TagStatements(sql.schema)
        self._notify = notify
        self._bucket = bucket_millis
        self._lone = {known: self._lone_sql(known) for known in (False, True)}
        self._batch = {
            (tagged, many, known): self._batch_sql(tagged, many, known)
            for tagged in (False, True)
            for many in (False, True)
            for known in (False, True)
        }

    def statement(self, batch: WriteBatch, writer: str, epoch: int) -> tuple[str, tuple[Any, ...]]:
        """The statement for ``batch`` and its parameters (``epoch``: the writer's partition map epoch)."""
        known = None not in batch.expected_seq_nrs
        if len(batch.payloads) == 1 and not batch.tags[0]:
            return self._lone[known], self._lone_params(batch, writer, epoch)
        tagged = any(batch.tags)
        many = len(batch.payloads) != len(batch)
        return self._batch[tagged, many, known], self._params(batch, writer, epoch, tagged, many)

    def _tail(self, tagged: bool, many: bool) -> tuple[str, str, str, str]:
        """The numbers of the optional parameters: notifications, bucket, event calls, positions."""
        names = [n for n, on in (("notify", self._notify), ("bucket", tagged), ("call", many), ("ordinal", many)) if on]
        at = {name: f"${17 + i}" for i, name in enumerate(names)}
        return at.get("notify", ""), at.get("bucket", ""), at.get("call", ""), at.get("ordinal", "")

    def _batch_sql(self, tagged: bool, many: bool, known: bool) -> str:
        """The batch statement; ``known``: every call names its expected_seq_nr."""
        notify_at, bucket_at, call_at, ordinal_at = self._tail(tagged, many)
        notify = (
            f", CASE WHEN chk.bad = 0 THEN (SELECT count(pg_notify('{self._channel}', g))"
            f" FROM unnest({notify_at}::text[]) g) END AS notified"
            if self._notify
            else ""
        )
        tags = f", tv AS ({self._tags.insert_from_events('src', '$13', bucket_at, '')}\n)" if tagged else ""
        if many:  # the events apart from their calls, joined to them by their call's position
            calls = f"ROWS FROM ({_CALL_FUNCTIONS}) WITH ORDINALITY AS c({_CALL_COLUMNS}, i)"
            events = (
                f"chk, ROWS FROM ({_EVENT_FUNCTIONS}, unnest({_ints(call_at, 'int')}),"
                f" unnest({_ints(ordinal_at, 'int')}))"
                f" WITH ORDINALITY AS e({_EVENT_COLUMNS}, call, ordinal, n) JOIN calls c ON c.i = e.call"
            )
            e, ordinal, n = "e", "e.ordinal", "e.n"
        else:  # one event per call: the events are in the calls' rows
            calls = (
                f"ROWS FROM ({_CALL_FUNCTIONS}, {_EVENT_FUNCTIONS})"
                f" WITH ORDINALITY AS c({_CALL_COLUMNS}, {_EVENT_COLUMNS}, i)"
            )
            events = "chk, calls c"
            e, ordinal, n = "c", "1", "c.i"
        return f"""
WITH {clock(self._schema, "$14", f"({_ints('$2', 'int')})")}, calls AS MATERIALIZED (
  SELECT c.*, h.seq_nr AS prev_seq, h.db_timestamp AS prev_ts,
    c.expected IS NOT NULL AND c.expected <> COALESCE(h.seq_nr, 0) AS bad
  FROM {calls}
  LEFT JOIN LATERAL ({highest("c.persistence_id", self._ej, "c.expected" if known else None)}) h ON true
), chk AS (
  SELECT count(*) FILTER (WHERE bad) AS bad, max(prev_ts) AS prev FROM calls
), src AS {"MATERIALIZED " if tagged else ""}(
  SELECT c.slice, COALESCE(c.entity_type, $4::text) AS entity_type, c.persistence_id,
    COALESCE(c.prev_seq, 0) + {ordinal} AS seq_nr, {stamp("chk.prev", n)} AS db_timestamp,
    COALESCE({e}.ser_id, {JSON_SERIALIZER_ID}) AS ser_id, COALESCE({e}.ser_manifest, '') AS ser_manifest,
    substring($10::bytea FROM {e}.payload_end - {e}.payload_length + 1 FOR {e}.payload_length) AS payload,
    CASE WHEN c.tags_json IS NULL THEN NULL
         ELSE ARRAY(SELECT jsonb_array_elements_text(c.tags_json::jsonb)) END AS tags,
    c.meta_ser_id, c.meta_ser_manifest, c.meta_payload
  FROM {events}
  WHERE chk.bad = 0
), ins AS (
  INSERT INTO {self._ej} ({_COLUMNS})
  SELECT slice, entity_type, persistence_id, seq_nr, db_timestamp, ser_id, ser_manifest, payload, false, $13::text,
    tags, meta_ser_id, meta_ser_manifest, meta_payload
  FROM src
  RETURNING 1
){tags}
SELECT {stamp("chk.prev", "1")} AS ts, chk.bad,
  CASE WHEN chk.bad > 0 THEN (SELECT array_agg(i ORDER BY i) FROM calls WHERE bad) END AS bad_calls,
  (SELECT array_agg(COALESCE(prev_seq, 0) ORDER BY i) FROM calls WHERE expected IS NULL) AS appended_after,
  {settle("ins")} AS settled{notify}
FROM chk"""

    def _lone_sql(self, known: bool) -> str:
        """One call of one untagged event, with scalar parameters: $1 slice, $2 entity type, $3 pid, $4 expected_seq_nr
        (NULL: append; given when ``known``), $5-$7 the event, $8 the writer, $9-$11 the metadata, $12 the writer's
        partition map epoch. One INSERT ... SELECT of one row, with the owner check and clock
        (:func:`.timestamp_rule.clock_of_one`) and the probe of the pid's newest row as its FROM items, its result
        (``ts``, ``bad`` 0, ``appended_after``) and NOTIFY in its RETURNING: a call that fails the check inserts
        nothing and the statement answers no row (:func:`failed_calls`). No CTE and no second branch to answer a
        conflict: 11 µs of the server's time per call less. One row has no per-row step, so there is nothing to settle
        (:func:`.timestamp_rule.settle` would wait for ``clock``, which has passed)."""
        group = "($1::int / 64)::text || ':' || $2::text"
        notify = f", pg_notify('{self._channel}', {group}) AS notified" if self._notify else ""
        prev = highest("$3::text", self._ej, "$4::bigint" if known else None)
        after = "NULL::bigint[]" if known else "ARRAY[seq_nr - 1]"
        return f"""
INSERT INTO {self._ej} ({_COLUMNS})
SELECT $1::int, $2::text, $3::text, COALESCE(p.seq_nr, 0) + 1, GREATEST(k.t, p.db_timestamp + {MICROSECOND}),
  $5::int, $6::text, $7::bytea, false, $8::text, NULL, $9::int, $10::text, $11::bytea
FROM {clock_of_one(self._schema, "$12", "$1::int")} LEFT JOIN LATERAL ({prev}) p ON true
WHERE $4::bigint IS NULL OR $4::bigint = COALESCE(p.seq_nr, 0)
RETURNING db_timestamp AS ts, 0 AS bad, {after} AS appended_after{notify}"""

    @staticmethod
    def _lone_params(b: WriteBatch, writer: str, epoch: int) -> tuple[Any, ...]:
        m = b.metadata[0]
        return (
            b.slices[0], b.entity_types[0], b.persistence_ids[0], b.expected_seq_nrs[0], b.ser_ids[0],
            b.manifests[0], b.payloads[0], writer, m.ser_id if m else None, m.manifest if m else None,
            m.payload if m else None, epoch,
        )  # fmt: skip

    def _params(self, b: WriteBatch, writer: str, epoch: int, tagged: bool, many: bool) -> tuple[Any, ...]:
        entity_type = b.entity_types[0]
        lengths = list(map(len, b.payloads))
        params: tuple[Any, ...] = (
            _json(b.persistence_ids), _json(b.slices), _json(_unless_all(b.entity_types, entity_type)), entity_type,
            _json(_unless_all(b.expected_seq_nrs, None)), _json(_tags_json(b.tags) if tagged else ()),
            *_metadata(b.metadata), b"".join(b.payloads), _json(_unless_all(b.ser_ids, JSON_SERIALIZER_ID)),
            _json(_unless_all(b.manifests, "")), writer, epoch, _json(list(accumulate(lengths))), _json(lengths),
        )  # fmt: skip
        if self._notify:
            params += (notify_groups(b.slices, b.entity_types),)
        if tagged:
            params += (self._bucket,)
        if many:
            params += tuple(map(_json, _positions(b.counts)))
        return params


def _json(column: Sequence[Any]) -> str:
    """A column (of ints, strs or None) as the one text the statement reads it from: its JSON, one
    call in C, where asyncpg's array encoder would check each element in Python (about 0.3 ms
    per 1000 elements and column)."""
    return _dumps(column).decode()


def _unless_all(column: Sequence[Any], value: Any) -> Sequence[Any]:
    """``column``, or an empty one when every element is ``value`` (the statement's default)."""
    return () if column.count(value) == len(column) else column


def _positions(counts: Sequence[int]) -> tuple[list[int], list[int]]:
    """Per event: its call (1-based) and its position in the call (1-based)."""
    calls = [c for c, k in enumerate(counts, 1) for _ in range(k)]
    ordinals = [o for k in counts for o in range(1, k + 1)]
    return calls, ordinals


def _tags_json(tags: Sequence[tuple[str, ...]]) -> list[str | None]:
    return [json.dumps(list(t)) if t else None for t in tags]


def _metadata(metadata: Sequence[Any]) -> tuple[Sequence[Any], Sequence[Any], Sequence[Any]]:
    if metadata.count(None) == len(metadata):
        return (), (), ()
    return (
        [m.ser_id if m else None for m in metadata],
        [m.manifest if m else None for m in metadata],
        [m.payload if m else None for m in metadata],
    )


def failed_calls(row: Any) -> list[int]:
    """The calls (0-based) of a statement's batch that failed the ``expected_seq_nr`` check, from
    the statement's answer ``row``: none when the batch was written. The lone statement answers
    no row when its call failed."""
    if row is None:
        return [0]
    return [i - 1 for i in row["bad_calls"]] if row["bad"] else []
