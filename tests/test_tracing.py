"""Tracing (issue 26) with the OpenTelemetry SDK's in-memory exporter: one trace from an entity
command, through its write and the group-commit batch, to the projection handler that applies
the event; slice query pages and replication batches get spans too; off, nothing is recorded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import asyncpg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from replication_helpers import Location, location_databases, open_locations

from journal import Entity, EntityRegistry, EventEnvelope, Journal, JournalSettings, Write, tracing
from journal.envelope import TRACE_MANIFEST
from journal.replication.replicator import LocalSource, Replicator
from projections import Worker
from tests.support.waiting import wait_until


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    try:
        yield exporter
    finally:
        tracing.disable()


class Cart(Entity[list[Any]]):
    entity_type = "TCart"

    def initial_state(self) -> list[Any]:
        return []

    async def on_command(self, command: Any) -> Any:
        self.persist({"added": command})
        return None

    def on_event(self, state: list[Any], event: Any) -> list[Any]:
        return [*state, event]


def named(finished: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in finished if s.name == name]


async def test_one_trace_from_an_entity_command_to_the_read_model(
    journal: Journal, settings: JournalSettings, spans: InMemorySpanExporter, dsn: str
) -> None:
    fast = JournalSettings.load(env={}, dsn=dsn, lease_ttl=1.5, lease_renew_interval=0.3)
    applied: list[EventEnvelope] = []

    async def handler(_conn: Any, envs: Sequence[EventEnvelope]) -> None:
        applied.extend(envs)

    worker = Worker(journal, fast, "traced", "TCart", handler, "grouped")
    task = asyncio.create_task(worker.run())
    async with EntityRegistry(journal) as entities:
        with tracing.span("POST /carts/c1/items") as request:  # the caller's own span, e.g. an HTTP request
            await entities.ask(Cart, "c1", "apple")
    await wait_until(lambda: applied or task.done(), 30, "the projection")
    worker.stop()
    await task
    finished = spans.get_finished_spans()
    trace_id = request.get_span_context().trace_id
    [command] = named(finished, "entity.command")
    [persist] = named(finished, "journal.persist")
    handles = named(finished, "projection.handle")
    assert handles, [s.name for s in finished]
    for s in (command, persist, *handles):
        assert s.context.trace_id == trace_id, s.name  # one trace, from the request to the read model
    assert command.parent.span_id == request.get_span_context().span_id
    assert persist.parent.span_id == command.context.span_id
    assert all(h.parent.span_id == persist.context.span_id for h in handles)  # the handler's parent is the write
    batches = [b for b in named(finished, "journal.write_batch") if persist.context in [lk.context for lk in b.links]]
    assert len(batches) == 1 and batches[0].attributes["calls"] >= 1
    projection_batches = named(finished, "projection.batch")
    write = (persist.context.trace_id, persist.context.span_id)
    assert any(write in [(lk.context.trace_id, lk.context.span_id) for lk in b.links] for b in projection_batches)
    assert named(finished, "journal.slice_page")
    # the context travels in the metadata columns; readers still see the metadata that was written
    assert applied[0].metadata is None and tracing.context_of(applied[0]) is not None
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT meta_ser_id, meta_ser_manifest, meta_payload FROM event_journal WHERE persistence_id = 'TCart|c1'"
        )
    finally:
        await conn.close()
    assert (row[0], row[1]) == (1, TRACE_MANIFEST)
    assert bytes(row[2]).startswith(b'{"traceparent":"00-' + format(trace_id, "032x").encode())


async def test_user_metadata_is_left_alone_and_a_traceparent_in_it_is_followed(
    journal: Journal, spans: InMemorySpanExporter
) -> None:
    await journal.persist("TCart|m1", [{"x": 1}], metadata={"source": "import"})
    [env] = [e async for e in journal.current_events_by_persistence_id("TCart|m1")]
    assert env.metadata == {"source": "import"} and tracing.context_of(env) is None
    with tracing.span("caller") as caller:
        headers: dict[str, str] = {}
        from opentelemetry import propagate

        propagate.inject(headers)
        await journal.persist("TCart|m2", [{"x": 2}], metadata={"source": "api", **headers})
    [env] = [e async for e in journal.current_events_by_slices("TCart", 0, 1023) if e.persistence_id == "TCart|m2"]
    ctx = tracing.context_of(env)
    from opentelemetry import trace

    assert trace.get_current_span(ctx).get_span_context().trace_id == caller.get_span_context().trace_id


@pytest.fixture(scope="module")
def dbs(server_dsn: str) -> Iterator[dict[str, str]]:
    with location_databases(server_dsn, ["A", "B"]) as d:
        yield d


@pytest.fixture
async def locs(dbs: dict[str, str]) -> AsyncIterator[dict[str, Location]]:
    async with open_locations(dbs, ["TLog"]) as opened:
        yield opened


async def test_replication_batches_have_spans(locs: dict[str, Location], spans: InMemorySpanExporter) -> None:
    a, b = locs["A"], locs["B"]
    for i in range(3):
        await a.journal.persist(f"TLog|e{i}", [{"v": i}])
    await Replicator(b.store, LocalSource(a.store), "TLog").catch_up()
    written = [s.attributes["written"] for s in named(spans.get_finished_spans(), "replication.batch")]
    assert sum(written) == 3


async def test_off_records_nothing_and_writes_no_trace_metadata(journal: Journal) -> None:
    assert not tracing.ON
    await journal.persist("TCart|off", [{"x": 1}])
    [env] = [e async for e in journal.current_events_by_persistence_id("TCart|off")]
    assert env.metadata is None and tracing.context_of(env) is None


async def test_every_write_shape_is_traced_to_its_handlers(
    journal: Journal, settings: JournalSettings, spans: InMemorySpanExporter, dsn: str
) -> None:
    """persist_many and persist_in have spans of their own, and their events carry the trace
    context: the handlers of their events continue the caller's trace (issue 32)."""
    fast = JournalSettings.load(env={}, dsn=dsn, lease_ttl=1.5, lease_renew_interval=0.3)
    applied: list[EventEnvelope] = []

    async def handler(_conn: Any, envs: Sequence[EventEnvelope]) -> None:
        applied.extend(envs)

    with tracing.span("bulk import") as bulk:
        await journal.persist_many(
            [Write(f"TShape|b{i}", [{"i": i}]) for i in range(5)] + [Write("TShape|own", [{"i": 9}], metadata={"m": 1})]
        )
    conn = await asyncpg.connect(dsn)
    try:
        with tracing.span("outbox transaction") as tx:
            async with conn.transaction():
                await journal.persist_in(conn, "TShape|in", [{"i": 10}])
    finally:
        await conn.close()
    worker = Worker(journal, fast, "shapes", "TShape", handler, "grouped")
    task = asyncio.create_task(worker.run())
    await wait_until(lambda: len(applied) >= 7 or task.done(), 30, "the projection")
    worker.stop()
    await task
    finished = spans.get_finished_spans()
    [many] = named(finished, "journal.persist_many")
    [into] = named(finished, "journal.persist_in")
    assert many.context.trace_id == bulk.get_span_context().trace_id and many.attributes["parts"] == 6
    assert into.context.trace_id == tx.get_span_context().trace_id
    handled = {s.attributes["persistence_id"]: s.context.trace_id for s in named(finished, "projection.handle")}
    assert handled == {
        **{f"TShape|b{i}": bulk.get_span_context().trace_id for i in range(5)},
        "TShape|in": tx.get_span_context().trace_id,
    }  # the part with metadata of its own carries none (as persist)
    own = [e for e in applied if e.persistence_id == "TShape|own"]
    assert [e.metadata for e in own] == [{"m": 1}]
