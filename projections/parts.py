"""What every processor of one projection's worker is made from (:class:`ProjectionParts`), and
how a processor's transaction runner and delivery are made from them, once, when it starts."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from journal.serialization import SerializerRegistry
from journal.settings import ProjectionSettings

from .dead_letter_store import DeadLetterSql
from .delivery import Delivery, Handling, delivery_for
from .handlers import Mode
from .isolation import Isolation
from .offset_rows import OffsetRows
from .outage import Outage
from .parked_store import ParkedSql
from .postgres_store import ProjectionSql
from .recovery import HandlerRecovery
from .sequencing import Sequencer
from .stats import Stats
from .transactions import Connections, TransactionRunner, Unit

R = TypeVar("R")


@dataclass(frozen=True)
class ProjectionParts:
    """One projection's parts in one worker, shared by its processors."""

    journal: Any
    """The source of events (a ``Journal``, or any object with the queries a processor reads)."""
    connections: Connections
    sql: ProjectionSql
    settings: ProjectionSettings
    name: str
    owner: str
    """The worker's id: the owner of the leases."""
    handler: Callable[..., Awaitable[None]]
    mode: Mode
    stats: Stats
    outage: Outage
    """Database outages, shared with the worker (logged once each; shown by status)."""
    recovery: HandlerRecovery
    serializers: SerializerRegistry | None
    """The journal's: a dead letter's error and traceback are sealed with the event's subject's
    key when it encrypts (:mod:`journal.sealed_text`)."""

    def transactions(self, key: str, stopping: asyncio.Event) -> TransactionRunner:
        """Every transaction and read of the database of the processor of unit ``key``."""
        return TransactionRunner(
            self.connections, Unit(self.name, self.owner, key), leases=self.sql.leases, settings=self.settings,
            outage=self.outage, stats=self.stats, stopping=stopping, serializers=self.serializers,
        )  # fmt: skip

    def delivery(self, tx: TransactionRunner, offsets: OffsetRows[R]) -> Delivery:
        """The projection's delivery (its mode) over a processor's offset rows, isolating
        poisoned events when its recovery strategy skips or dead-letters them (and parking the
        later events of a dead letter's persistence id behind it when it is sequenced)."""
        tries = self.recovery.tries(self.settings)
        sequencer = Sequencer(ParkedSql(self.sql.schema), tx, self.stats) if self.recovery.sequenced else None
        isolation = Isolation.of(
            self.recovery, tx, offsets, dead_letters=DeadLetterSql(self.sql.schema), stats=self.stats, tries=tries,
            serializers=self.serializers, sequencer=sequencer,
        )  # fmt: skip
        handling = Handling(self.handler, tx, offsets, self.stats, tries, isolation, sequencer)
        return delivery_for(self.mode, handling, self.settings)
