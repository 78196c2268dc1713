"""Subprocess of the Kafka tests: ``python -m tests.kafka_worker DSN BOOTSTRAP TOPIC MODE CRASH``.

Runs projection ``pub-<TOPIC>`` over entity type ``acct`` with a :class:`KafkaPublisher` on TOPIC
(MODE ``exactly-once`` or ``at-least-once``) until it has committed offsets for every event, then
exits 0. CRASH ``after:N``: the process SIGKILLs itself right after the N-th batch is published
to Kafka, before the runner commits that batch's offsets in PostgreSQL; ``inside:N``: while it
serializes the N-th event, inside a Kafka transaction (begun, nothing of it sent yet);
``flushed:N``: before the N-th commit of a Kafka transaction, once its records are in the topic
(flushed, not committed); ``none``: no crash.

Optional settings from the environment: ``SJ_KAFKA_GROUP_SIZE`` (events a batch, 25),
``SJ_KAFKA_TIMEOUT`` (the publisher's seconds for a Kafka call, 30), ``SJ_KAFKA_ON_FAILURE``
(the failure strategy, the settings' default).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import orjson

from journal import EventEnvelope, JournalSettings, open_journal
from projections import Worker
from projections.kafka import publisher as kafka_publisher
from projections.kafka.publisher import KafkaPublisher
from projections.management import processed_up_to
from tests.support.waiting import wait_until


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def die_before_commit(count: int) -> None:
    """``flushed:N``: the publisher's N-th ``commit_transaction`` flushes the transaction's records
    to the brokers, then the process SIGKILLs itself (the transaction open, its records written)."""
    original = kafka_publisher._Range._call
    commits = 0

    async def call(self: Any, op: Any, seconds: float) -> None:
        nonlocal commits
        if op == self.producer.commit_transaction:
            commits += 1
            if commits == count:
                await asyncio.to_thread(self.producer.flush, seconds)
                die()
        await original(self, op, seconds)

    kafka_publisher._Range._call = call  # type: ignore[method-assign]


async def main(dsn: str, bootstrap: str, topic: str, mode: str, crash: str) -> None:
    where, _, n = crash.partition(":")
    count = int(n or 0)
    group_size = int(os.environ.get("SJ_KAFKA_GROUP_SIZE", "25"))
    settings = JournalSettings.load(
        env={}, dsn=dsn, lease_ttl=1.5, lease_renew_interval=0.3, handler_backoff=0.02, group_size=group_size
    )
    serialized = 0
    if where == "flushed":
        die_before_commit(count)

    def value(event: Any) -> bytes:
        nonlocal serialized
        serialized += 1
        if where == "inside" and serialized == count:
            die()
        return orjson.dumps(event)

    timeout = float(os.environ.get("SJ_KAFKA_TIMEOUT", "30"))
    publisher = KafkaPublisher(bootstrap, topic, exactly_once=mode == "exactly-once", value=value, timeout=timeout)
    batches = 0

    async def handler(conn: Any, envelopes: Sequence[EventEnvelope]) -> None:
        nonlocal batches
        await publisher(conn, envelopes)
        batches += 1
        if where == "after" and batches == count:
            die()

    async with open_journal(dsn, settings=settings) as j:
        recovery = os.environ.get("SJ_KAFKA_ON_FAILURE")
        worker = Worker(j, settings, f"pub-{topic}", "acct", handler, "grouped", recovery=recovery)
        task = asyncio.create_task(worker.run())
        targets = {pid: await j.highest_seq_nr(pid) async for pid in j.current_persistence_ids("acct")}
        assert targets, "no events of entity type acct"

        async def caught_up_or_failed() -> bool:
            return task.done() or await processed_up_to(j, f"pub-{topic}", targets)

        await wait_until(caught_up_or_failed, 120, "the publisher to catch up", every=0.05)
        if task.done():
            task.result()
        worker.stop()
        await task
        await publisher.close()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
