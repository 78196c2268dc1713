"""Entities whose database's answers are lost while its commits go on (a TCP relay drops them).

The journal talks to PostgreSQL through :class:`tests.support.relay.Relay`; three times, for a
while, every answer of the server is thrown away and its connection cut, so writes commit without
the entities learning it, and the reads that would resolve them get no answer either. Commands
and confirmed deliveries go on throughout. Afterwards, read straight from the database: no
command was answered with an error that promises "nothing written" (``SequenceConflict``,
``JournalUnavailable`` with ``outcome_unknown`` False) while its event is stored, every command
answered as written is stored once, and no delivery was sent again once its confirmation was
stored.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from journal import (
    Entity,
    EntityRegistry,
    JournalSettings,
    JournalUnavailable,
    SequenceConflict,
    after_persist,
    open_journal,
)
from journal.entities import Delivery
from tests.support.relay import relay_to
from tests.support.waiting import wait_until

OUTAGES = 3
OUTAGE_SECONDS = 1.5


class Account(Entity[list[str]]):
    entity_type = "lostanswers"

    def initial_state(self) -> list[str]:
        return []

    def on_command(self, command: Any) -> Any:
        self.persist(command)
        return after_persist(lambda: len(self.state))

    def on_event(self, state: list[str], event: str) -> list[str]:
        return [*state, event]


class Sms(Entity[list[str]]):
    """``("send", text)`` delivers the text to the gateway until ``("confirm", id)`` (the
    gateway's callback, which comes separately)."""

    entity_type = "lostsms"
    redeliver_interval = 0.2

    def initial_state(self) -> list[str]:
        return []

    def on_command(self, command: Any) -> Any:
        if command[0] == "send":
            self.persist(f"send:{command[1]}")
            return None
        if command[0] == "confirm" and command[1] in self.unconfirmed:
            self.persist_confirmation(f"confirmed:{command[1]}", command[1])
        return sorted(self.unconfirmed)

    def on_event(self, state: list[str], event: str) -> list[str]:
        if event.startswith("send:"):
            self.deliver(event[5:], event[5:], "gateway")
        return [*state, event]


def promises_nothing_written(e: BaseException) -> bool:
    return isinstance(e, SequenceConflict) or (isinstance(e, JournalUnavailable) and not e.outcome_unknown)


async def test_stored_writes_are_never_reported_unwritten_when_answers_are_lost(dsn: str) -> None:
    from conftest import truncate_all

    await truncate_all(dsn)
    async with relay_to(dsn) as relay:
        through = relay.dsn_through(dsn)
        settings = JournalSettings.load(
            env={}, dsn=through, attempts=2, initial_backoff=0.01, max_backoff=0.05, connect_timeout=1.0,
            breaker_failures=2, breaker_reset_timeout=0.3, resolve_max_backoff=0.2,
        )  # fmt: skip
        outcomes: dict[str, BaseException | None] = {}
        sent: dict[str, list[float]] = {}  # delivery id -> when the gateway got it
        uids = itertools.count()
        stop = asyncio.Event()
        async with open_journal(through, settings=settings, migrate=False) as j, EntityRegistry(j) as reg:
            callbacks: set[asyncio.Task[Any]] = set()

            async def gateway(d: Delivery) -> None:  # accepts at once, confirms a moment later
                sent.setdefault(d.delivery_id, []).append(time.time())
                callback = asyncio.create_task(reg.ask_pid(d.sender, ("confirm", d.delivery_id)))
                callbacks.add(callback)
                callback.add_done_callback(callbacks.discard)
                callback.add_done_callback(lambda t: t.cancelled() or t.exception())  # a lost one: sent again

            reg.add_destination("gateway", gateway)

            async def client(k: int) -> None:
                while not stop.is_set():
                    uid = f"u{next(uids)}"
                    try:
                        if k % 3 == 0:
                            await reg.ask(Sms, f"s{k}", ("send", uid))
                        else:
                            await reg.ask(Account, f"a{k % 4}", uid)
                        outcomes[uid] = None
                    except Exception as e:
                        outcomes[uid] = e
                    await asyncio.sleep(0.005)  # the application's pace between commands

            clients = [asyncio.create_task(client(k)) for k in range(9)]
            try:
                for _ in range(OUTAGES):
                    done = len(outcomes)
                    await wait_until(lambda n=done: len(outcomes) >= n + 50, 60, "commands between outages")
                    relay.losing = True
                    await asyncio.sleep(OUTAGE_SECONDS)  # the outage: its length is the scenario
                    relay.losing = False
            finally:
                stop.set()
                await asyncio.gather(*clients)

            async def all_confirmed() -> bool:
                return all([await reg.ask(Sms, f"s{k}", ("read",)) == [] for k in range(0, 9, 3)])

            await wait_until(all_confirmed, 60, "every delivery to be confirmed", every=0.1)
            await asyncio.gather(*callbacks, return_exceptions=True)

    assert relay.lost_answers > 0
    assert any(e is not None for e in outcomes.values()), "the outages failed no command"
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn), migrate=False) as direct:
        stored: dict[str, int] = {}
        confirmed_at: dict[str, float] = {}
        for et in ("lostanswers", "lostsms"):
            async for env in direct.current_events_by_slices(et, 0, 1023):
                uid = env.event.partition(":")[2] if et == "lostsms" else env.event
                kind = env.event.partition(":")[0] if et == "lostsms" else "deposit"
                if kind == "confirmed":
                    confirmed_at[uid] = env.db_timestamp.timestamp()
                else:
                    stored[uid] = stored.get(uid, 0) + 1
    wrongly = sorted(u for u, e in outcomes.items() if e is not None and promises_nothing_written(e) and u in stored)
    assert not wrongly, f"{len(wrongly)} commands answered 'not written' are stored, e.g. {wrongly[:3]}: " + str(
        [repr(outcomes[u]) for u in wrongly[:3]]
    )
    unknown = [u for u, e in outcomes.items() if isinstance(e, JournalUnavailable) and e.outcome_unknown]
    assert not unknown, "an entity's answer is never 'outcome unknown': it resolves it"
    answered = [u for u, e in outcomes.items() if e is None]
    assert all(stored.get(u) == 1 for u in answered), "a write answered as written is stored once"
    assert set(confirmed_at) == {u for u in stored if u in sent}
    late = {d: [round(t - confirmed_at[d], 3) for t in ts if t > confirmed_at[d] + 0.05] for d, ts in sent.items()}
    late = {d: v for d, v in late.items() if v}
    assert not late, f"deliveries sent again after their confirmation was stored: {late}"
