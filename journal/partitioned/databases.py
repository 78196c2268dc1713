"""The databases of a partitioned journal: one PostgreSQL backend each, their health, and the map.

The configured databases (``partitions.databases``, in order) come first; a database that a
map row names (the target of a move) is opened when the map is loaded, with a password
found as :mod:`journal.postgres.credentials` says (a map row never holds one). Every database's
backend writes with the same writer id and sends the map's epoch. A database that failed is
not asked again until a probe finds it back (its slices fail fast with JournalUnavailable
meanwhile, so the group commit's batches of the other databases do not wait on its retries).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from ..conditions import Condition
from ..errors import JournalUnavailable
from ..postgres import PartitionRow, Passwords, PostgresBackend, redact, without_password
from ..settings import JournalSettings
from .layout import PartitionMap

log = logging.getLogger("journal.partitioned")

PROBE_INTERVAL = 0.2
"""Seconds between probes of a database that failed."""


class Databases:
    """One backend per database, the partition map built from their rows, and who is down."""

    def __init__(
        self, configured: Sequence[str], settings: JournalSettings, writer_id: str, given: Sequence[str] = ()
    ) -> None:
        """``given``: other DSNs this process was given (the home one), whose passwords the
        databases that map rows name may need."""
        self.settings = settings
        self.writer_id = writer_id
        self.passwords = Passwords([*configured, *given])
        self.seeded = len(configured)
        self.dsns: list[str] = list(configured)
        self.backends: list[PostgresBackend] = [self._backend(d) for d in configured]
        self._started: list[bool] = [False] * len(configured)
        self._rows: dict[int, list[PartitionRow]] = {}
        self.map = PartitionMap.build(self.seeded, {i: [] for i in range(self.seeded)})
        self.generation = 0
        """Grows with every map load (a caller refused at generation g reloads only if still g)."""
        self._reload_lock = asyncio.Lock()
        self._down: dict[int, asyncio.Task[None]] = {}
        self._why: dict[int, str] = {}
        """Per database that is down: what its last failure said."""
        self._conditions = [Condition(log, logging.WARNING) for _ in configured]
        self._listeners: list[object] = []

    def _backend(self, dsn: str) -> PostgresBackend:
        s = self.settings.with_dsn(dsn)
        return PostgresBackend(dsn, s)

    @property
    def names(self) -> list[str]:
        """The databases for people: DSNs without passwords."""
        return [redact(d) for d in self.dsns]

    # -- lifecycle ----------------------------------------------------------------------------

    async def open(self, *, claim: bool) -> None:
        """Start every configured database that answers (at least one must) and load the map.
        ``claim``: record each database's range of the layout in its map if it has none."""
        got = await asyncio.gather(*(self._start(i) for i in range(self.seeded)), return_exceptions=True)
        errors = [g for g in got if isinstance(g, BaseException)]
        for g in errors:
            if not isinstance(g, JournalUnavailable):
                await self.close()
                raise g
        if len(errors) == len(got):
            await self.close()
            raise errors[0]
        if claim:
            seeds = PartitionMap.seed(self.seeded)
            for i in range(self.seeded):
                if self._started[i]:
                    self._rows[i] = await self.backends[i].partitions().claim(*seeds[i])
        await self.reload()

    async def _start(self, i: int) -> None:
        try:
            await self.backends[i].start()
        except JournalUnavailable as e:
            self._mark_down(i, e)
            raise
        self._started[i] = True

    async def close(self) -> None:
        for t in self._down.values():
            t.cancel()
        for t in self._down.values():
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._down.clear()
        for i, b in enumerate(self.backends):
            if self._started[i]:
                await b.close()
                self._started[i] = False

    # -- the map ------------------------------------------------------------------------------

    async def reload(self, seen_generation: int | None = None) -> PartitionMap:
        """Read every database's rows (keeping the last ones of a database that does not answer),
        open the databases they name, and rebuild the map. ``seen_generation``: the generation a
        refused caller saw; if the map was reloaded since, that load is enough."""
        async with self._reload_lock:
            if seen_generation is not None and self.generation != seen_generation:
                return self.map
            done: set[int] = set()
            while True:
                todo = [i for i in range(len(self.backends)) if i not in done]
                if not todo:
                    break
                got = await asyncio.gather(*(self._read_rows(i) for i in todo), return_exceptions=True)
                for i, rows in zip(todo, got, strict=True):
                    done.add(i)
                    if isinstance(rows, list):
                        self._rows[i] = rows
                for i in todo:
                    for r in self._rows.get(i, []):
                        self._known(r.location)  # a move's target or source
            self.map = PartitionMap.build(self.seeded, {i: self._rows.get(i, []) for i in range(len(self.backends))})
            for b in self.backends:
                b.use_epoch(self.map.epoch)
            self.generation += 1
            for hook in list(self._listeners):
                hook()  # type: ignore[operator]
            return self.map

    def rows_of(self, i: int) -> list[PartitionRow]:
        """Database ``i``'s map rows as last read."""
        return self._rows.get(i, [])

    def on_reload(self, hook: object) -> None:
        """Call ``hook()`` after every map load (the slice reads listen on new databases)."""
        self._listeners.append(hook)

    async def _read_rows(self, i: int) -> list[PartitionRow]:
        b = await self.usable(i)
        try:
            return await b.partitions().rows()
        except JournalUnavailable as e:
            self._mark_down(i, e)
            raise

    def _known(self, location: str | None) -> int | None:
        """The index of the database a map row names, opened (lazily) if it is new."""
        if not location:
            return None
        for i, d in enumerate(self.dsns):
            if without_password(d) == location:
                return i
        dsn = self.passwords.fill(location)
        self.dsns.append(dsn)
        self.backends.append(self._backend(dsn))
        self._started.append(False)
        self._conditions.append(Condition(log, logging.WARNING))
        return len(self.dsns) - 1

    def index_of(self, dsn: str) -> int:
        """The index of a database (opened lazily if the journal did not know it); the password
        of ``dsn`` is known from now on (a move's ``--to``)."""
        self.passwords.learn(dsn)
        i = self._known(without_password(dsn))
        assert i is not None
        if self.dsns[i] != dsn and not self._started[i] and i not in self._down:
            # the caller's DSN has the password the map's row lacks (one already open stays)
            self.dsns[i] = self.passwords.fill(dsn)
            self.backends[i] = self._backend(self.dsns[i])
        return i

    # -- health -------------------------------------------------------------------------------

    async def usable(self, i: int) -> PostgresBackend:
        """Database ``i``'s backend, started; JournalUnavailable at once while it is known down."""
        if i in self._down:
            raise JournalUnavailable(
                f"database {self.names[i]} is unavailable ({self._why.get(i, 'it failed')}; probing until it answers)"
            )
        if not self._started[i]:
            await self._start(i)
        return self.backends[i]

    def failed(self, i: int, error: BaseException) -> None:
        """An operation on database ``i`` ended in JournalUnavailable: probe it before asking again."""
        if isinstance(error, JournalUnavailable) and not error.outcome_unknown:
            self._mark_down(i, error)

    def _mark_down(self, i: int, error: JournalUnavailable) -> None:
        if i not in self._down:
            self._why[i] = str(error)
            self._conditions[i].occurred("database %s is unavailable; its slices fail until it answers", self.names[i])
            self._down[i] = asyncio.create_task(self._probe(i), name=f"journal-probe-{i}")

    async def _probe(self, i: int) -> None:
        b = self.backends[i]
        while True:
            await asyncio.sleep(PROBE_INTERVAL)
            try:
                if not self._started[i]:
                    await b.start()
                    self._started[i] = True
                else:
                    await b.partitions().rows()
            except JournalUnavailable:
                continue
            except Exception as e:  # a database that answers with an error is up: let operations see it
                log.warning("probe of %s: %s", self.names[i], e)
            break
        del self._down[i]
        self._conditions[i].clear(f"database {self.names[i]} is available again")
