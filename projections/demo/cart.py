"""The demo application: shopping carts written concurrently, projected into a read model.

Used by ``journal demo``; also a worked example of a grouped exactly-once handler. The read
model is the application's own tables (their SQL in :mod:`projections.demo.statements`),
written in the offset transaction.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from journal.envelope import EventEnvelope
from journal.errors import SequenceConflict, UnsupportedOperation
from journal.journal import Journal

from . import statements


def cart_event(rng: random.Random, events_so_far: int) -> dict[str, Any]:
    if events_so_far >= 6 and rng.random() < 0.05:
        return {"type": "CheckedOut"}
    if events_so_far > 0 and rng.random() < 0.25:
        return {"type": "ItemRemoved", "item": f"sku-{rng.randrange(50)}", "qty": 1}
    return {"type": "ItemAdded", "item": f"sku-{rng.randrange(50)}", "qty": rng.randint(1, 3)}


@dataclass
class CartState:
    quantity: int = 0
    events: int = 0
    checked_out: bool = False

    def apply(self, event: dict[str, Any]) -> None:
        self.events += 1
        if event["type"] == "ItemAdded":
            self.quantity += event["qty"]
        elif event["type"] == "ItemRemoved":
            self.quantity -= event["qty"]
        elif event["type"] == "CheckedOut":
            self.checked_out = True


async def project_carts(conn: asyncpg.Connection, envelopes: Sequence[EventEnvelope]) -> None:
    """Grouped exactly-once handler: one transaction with the offsets (called by the runner)."""
    await conn.execute(
        statements.INSERT_PROJECTED,
        [e.entity_type for e in envelopes],
        [e.persistence_id for e in envelopes],
        [e.seq_nr for e in envelopes],
        [e.db_timestamp for e in envelopes],
    )
    delta: dict[str, CartState] = defaultdict(CartState)
    types: dict[str, str] = {}
    for e in envelopes:
        delta[e.persistence_id].apply(e.event)
        types[e.persistence_id] = e.entity_type
    pids = sorted(delta)
    await conn.execute(
        statements.UPSERT_VIEW,
        pids,
        [types[p] for p in pids],
        [delta[p].quantity for p in pids],
        [delta[p].events for p in pids],
        [delta[p].checked_out for p in pids],
    )


async def prepare(conn: asyncpg.Connection) -> None:
    await conn.execute(statements.READ_MODEL_DDL)


async def projected_count(conn: asyncpg.Connection, entity_type: str) -> int:
    """Events of ``entity_type`` in the read model so far (with duplicates, were there any)."""
    return int(await conn.fetchval(statements.COUNT_PROJECTED, entity_type))


class CartWorkload:
    """``writers`` tasks, each owning its carts, persisting 1-3 events per call at a target rate;
    now and then a long transaction (begun, held ``long_tx_seconds``, then committed)."""

    def __init__(self, journal: Journal, entity_type: str, entities: int, writers: int, rate: float) -> None:
        self.journal = journal
        self.entity_type = entity_type
        self.carts = [f"{entity_type}|cart-{i}" for i in range(entities)]
        self.writers = writers
        self.rate = rate
        self.written = 0
        self.conflicts = 0
        self.long_transactions = 0
        self._counts: dict[str, int] = defaultdict(int)
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        await asyncio.gather(*(self._writer(k) for k in range(self.writers)), self._long_transactions())

    async def _writer(self, k: int) -> None:
        rng = random.Random(k)
        mine = self.carts[k :: self.writers]
        per_call = 2.0
        interval = self.writers * per_call / self.rate
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not self._stop.is_set() and mine:
            pid = rng.choice(mine)
            n = self._counts[pid]
            events: list[dict[str, Any]] = []
            for _ in range(rng.randint(1, 3)):
                ev = cart_event(rng, n + len(events))
                events.append(ev)
                if ev["type"] == "CheckedOut":
                    mine.remove(pid)
                    break
            try:
                await self.journal.persist(pid, events)
                self._counts[pid] += len(events)
                self.written += len(events)
            except SequenceConflict:
                self.conflicts += 1
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def _long_transactions(self, hold: float = 1.5) -> None:
        """A transaction that takes its db_timestamp now and commits ``hold`` seconds later:
        the case the slice query's horizon exists for (its events must not be skipped)."""
        backend = self.journal.backend
        try:
            backend.pool_for(f"{self.entity_type}|long-0")
        except UnsupportedOperation:  # no transaction of ours to hold open (Cassandra)
            return
        rng = random.Random(99)
        i = 0
        while not self._stop.is_set():
            await asyncio.sleep(3.0)
            pid = f"{self.entity_type}|long-{i}"
            i += 1
            ev = {"type": "ItemAdded", "item": f"sku-{rng.randrange(50)}", "qty": 1}
            # several databases: the transaction is on the one that serves the pid's slice
            pool = backend.pool_for(pid)
            async with pool.acquire() as conn, conn.transaction():
                await self.journal.persist_in(conn, pid, [ev])  # a transaction held open
                await asyncio.sleep(hold)
            self.written += 1
            self.long_transactions += 1


@dataclass
class Verification:
    written: int
    projected_rows: int
    distinct_projected: int
    missing: int
    duplicates: int
    view_mismatches: int
    latency_p50: float
    latency_p99: float
    latency_max: float

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.duplicates == 0 and self.view_mismatches == 0


async def verify(journal: Journal, conn: asyncpg.Connection, entity_type: str) -> Verification:
    """Replay the journal by persistence id and compare with the read model."""
    expected: dict[str, CartState] = {}
    journal_keys: set[tuple[str, int]] = set()
    async for pid in journal.current_persistence_ids(entity_type):
        st = CartState()
        async for e in journal.current_events_by_persistence_id(pid):
            st.apply(e.event)
            journal_keys.add((pid, e.seq_nr))
        expected[pid] = st
    rows = await conn.fetch(statements.PROJECTED_KEYS, entity_type)
    projected = [(r[0], r[1]) for r in rows]
    distinct = set(projected)
    view = {
        r["persistence_id"]: CartState(r["quantity"], r["events"], r["checked_out"])
        for r in await conn.fetch(statements.VIEW_ROWS, entity_type)
    }
    mismatches = sum(1 for pid, st in expected.items() if view.get(pid) != st) + len(set(view) - set(expected))
    lat: Any = await conn.fetchrow(statements.LATENCIES, entity_type)
    return Verification(
        written=len(journal_keys),
        projected_rows=len(projected),
        distinct_projected=len(distinct),
        missing=len(journal_keys - distinct),
        duplicates=len(projected) - len(distinct),
        view_mismatches=mismatches,
        latency_p50=float(lat["p50"] or 0),
        latency_p99=float(lat["p99"] or 0),
        latency_max=float(lat["mx"] or 0),
    )


def dumps(v: Verification) -> str:
    return json.dumps(v.__dict__)
