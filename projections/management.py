"""Management of projections: status, pause, resume, reset, clear (what the CLI calls), and a
catch-up check for tools and tests. The SQL is in :class:`~projections.postgres_store.ProjectionSql`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from journal import Journal
from journal.errors import InvalidArgument, ProjectionError, UnknownProjection
from journal.ids import NUMBER_OF_SLICES, slice_for
from journal.postgres import LeaseSql, connect
from journal.settings import JournalSettings

from .postgres_store import HEARTBEAT_PID, OffsetRow, ProjectionSql
from .worker import parse_key


class ManagementStore(Protocol):
    """What management needs of the offset store (:class:`~projections.postgres_store.ProjectionSql`)."""

    async def now(self, conn: Any) -> datetime: ...
    async def projection_names(self, conn: Any) -> list[str]: ...
    async def slice_offsets(self, conn: Any, name: str) -> Sequence[Any]: ...
    @property
    def leases(self) -> LeaseSql: ...
    async def paused_keys(self, conn: Any, name: str) -> list[str]: ...
    async def set_paused(self, conn: Any, name: str, key: str, paused: bool) -> None: ...
    async def save_offsets(self, conn: Any, name: str, key: str, rows: list[OffsetRow]) -> list[int]: ...
    async def delete_offsets(self, conn: Any, name: str, slices: list[int]) -> int: ...


def slice_key(lo: int, hi: int) -> str:
    if not (0 <= lo <= hi < NUMBER_OF_SLICES):
        raise InvalidArgument(f"slice range {lo}-{hi} is not within 0-{NUMBER_OF_SLICES - 1}")
    return f"{lo}-{hi}"


@dataclass(frozen=True)
class RangeStatus:
    lo: int
    hi: int
    owner: str | None
    offset: datetime | None
    """Earliest of the slices' latest offsets (None: a slice has none yet)."""
    lag_seconds: float | None
    paused: bool
    database: str | None = None
    """The database serving the range's events (a journal over several databases)."""


@dataclass(frozen=True)
class ProjectionStatus:
    name: str
    ranges: list[RangeStatus]
    workers: list[dict[str, Any]]
    dead_letters: int = 0
    """Events parked by ``retry-and-dead-letter`` and not retried or discarded yet."""
    parked: int = 0
    """Events held behind dead letters (``retry-and-dead-letter-sequenced``), not drained yet."""


async def require_known(conn: Any, sql: ManagementStore, name: str) -> None:
    """Refuse a projection name that nothing knows (no worker, offset or pause ever stored): a
    typo would otherwise be paused, reset or cleared without a word. Names the known ones."""
    known = await sql.projection_names(conn)
    if name not in known:
        raise UnknownProjection(
            f"unknown projection {name!r}: known projections are {', '.join(map(repr, known))}"
            if known
            else f"unknown projection {name!r}: no projection has run against this database yet"
        )


class DeadLetterCount(Protocol):
    async def count(self, conn: Any, name: str) -> int: ...


class ParkedCount(Protocol):
    async def count(self, conn: Any, name: str, pid: str | None = None) -> int: ...


async def status(
    conn: Any, sql: ManagementStore, name: str, dead_letters: DeadLetterCount | None = None,
    databases: Sequence[tuple[int, int, str]] = (), parked: ParkedCount | None = None,
) -> ProjectionStatus:  # fmt: skip
    """Per slice range (grouped by owner, and by database: ``databases`` are the journal's
    ``(min_slice, max_slice, database)`` runs when it has several): offset, lag, owner, paused;
    the workers; the number of dead letters (when ``dead_letters`` is given) and of the events
    parked behind them (when ``parked`` is)."""
    db: list[str | None] = [None] * NUMBER_OF_SLICES
    for lo, hi, where in databases:
        db[lo : hi + 1] = [where] * (hi - lo + 1)
    await require_known(conn, sql, name)
    now = await sql.now(conn)
    offsets = {r["slice"]: r["ts"] for r in await sql.slice_offsets(conn, name)}
    leases = {r["slice"]: (r["owner"] if r["live"] else None) for r in await sql.leases.lease_owners(conn, name)}
    paused: set[int] = set()
    for key in await sql.paused_keys(conn, name):
        paused.update(parse_key(key))
    ranges: list[RangeStatus] = []
    start = 0
    for s in range(1, NUMBER_OF_SLICES + 1):
        if (
            s < NUMBER_OF_SLICES and leases.get(s) == leases.get(start) and (s in paused) == (start in paused)
            and db[s] == db[start]
        ):  # fmt: skip
            continue
        ts = [offsets.get(x) for x in range(start, s)]
        offset = None if any(t is None for t in ts) else min(t for t in ts if t is not None)
        ranges.append(
            RangeStatus(
                lo=start,
                hi=s - 1,
                owner=leases.get(start),
                offset=offset,
                lag_seconds=(now - offset).total_seconds() if offset else None,
                paused=start in paused,
                database=db[start],
            )
        )
        start = s
    workers = [dict(r) for r in await sql.leases.workers(conn, name)]
    dead = await dead_letters.count(conn, name) if dead_letters is not None else 0
    held = await parked.count(conn, name) if parked is not None else 0
    return ProjectionStatus(name, ranges, workers, dead, held)


def status_json(statuses: list[ProjectionStatus], versions: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """``projections status --json``: one object per projection, timestamps in ISO 8601;
    ``versions``: by versioned name (``NAME@N``), what its ``version`` field says (else null)."""

    def default(value: Any) -> Any:
        if isinstance(value, datetime):
            return value.isoformat()
        raise TypeError(f"not JSON: {type(value).__name__}")

    out = [
        {
            "name": st.name,
            "ranges": [
                {"slices": f"{r.lo}-{r.hi}", "lo": r.lo, "hi": r.hi, "owner": r.owner, "offset": r.offset,
                 "lag_seconds": r.lag_seconds, "paused": r.paused, "database": r.database}
                for r in st.ranges
            ],
            "workers": st.workers,
            "dead_letters": st.dead_letters,
            "parked": st.parked,
            "version": (versions or {}).get(st.name),
        }
        for st in statuses
    ]  # fmt: skip
    return json.dumps(out, default=default, indent=2)


async def set_paused(conn: Any, sql: ManagementStore, name: str, lo: int, hi: int, paused: bool) -> None:
    key = slice_key(lo, hi)
    await require_known(conn, sql, name)
    if paused:
        await sql.set_paused(conn, name, key, True)
        return
    # resume clears every pause that overlaps the range
    for k in await sql.paused_keys(conn, name):
        r = parse_key(k)
        if r.start <= hi and lo <= r.stop - 1:
            await sql.set_paused(conn, name, k, False)


async def _require_stopped(conn: Any, sql: ManagementStore, name: str, lo: int, hi: int) -> None:
    paused: set[int] = set()
    for key in await sql.paused_keys(conn, name):
        paused.update(parse_key(key))
    live = [w for w in await sql.leases.workers(conn, name) if w["live"] and w["state"] == "running"]
    if live and not set(range(lo, hi + 1)) <= paused:
        raise ProjectionError(
            f"projection {name!r} has {len(live)} running worker(s): pause slices {lo}-{hi} first "
            f"(projections pause {name} --slices {lo}-{hi})"
        )


async def reset(conn: Any, sql: ManagementStore, name: str, lo: int, hi: int, to: datetime) -> None:
    """Restart slices ``lo..hi`` at ``to``: events before it count as processed, later ones are redone."""
    slice_key(lo, hi)
    if to.tzinfo is None:
        to = to.replace(tzinfo=UTC)
    await require_known(conn, sql, name)
    await _require_stopped(conn, sql, name, lo, hi)
    async with conn.transaction():
        slices = list(range(lo, hi + 1))
        await sql.delete_offsets(conn, name, slices)
        await sql.save_offsets(conn, name, slice_key(lo, hi), [OffsetRow(s, HEARTBEAT_PID, 0, to) for s in slices])


async def clear(conn: Any, sql: ManagementStore, name: str, lo: int, hi: int) -> int:
    """Forget the offsets of slices ``lo..hi``: they are processed again from the start."""
    slice_key(lo, hi)
    await require_known(conn, sql, name)
    await _require_stopped(conn, sql, name, lo, hi)
    return await sql.delete_offsets(conn, name, list(range(lo, hi + 1)))


async def processed_up_to(source: Journal | JournalSettings, name: str, targets: Mapping[str, int]) -> bool:
    """True when projection ``name`` has committed offsets for ``targets`` (pid -> seq_nr) or beyond.

    A catch-up check for tools and tests (e.g. run a writer until it is caught up, then stop).
    ``source``: an open journal on PostgreSQL (a connection of its pool: one pool per process;
    a partitioned journal's home database), or settings with a DSN (a connection of its own).
    """
    if isinstance(source, JournalSettings):
        settings, dsn = source, source.connection.dsn
        if dsn is None:
            raise InvalidArgument("processed_up_to needs settings with a DSN")
        conn = await connect(dsn, settings)
        try:
            return await _stored_up_to(conn, ProjectionSql(settings.schema), name, targets)
        finally:
            await conn.close()
    async with source.backend.shared_connections().pool.acquire() as conn:
        return await _stored_up_to(conn, ProjectionSql(source.settings.schema), name, targets)


async def _stored_up_to(conn: Any, sql: ProjectionSql, name: str, targets: Mapping[str, int]) -> bool:
    for pid, seq_nr in targets.items():
        stored = await sql.load_pid(conn, name, slice_for(pid), pid)
        if stored is None or stored[0] < seq_nr:
            return False
    return True


_store_conforms: type[ManagementStore] = ProjectionSql
"""mypy checks here that the Postgres offset store implements :class:`ManagementStore`."""
