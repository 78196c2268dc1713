"""Example application: orders paid through a flaky payment gateway (docs/example-order-payment.md).

Four parts of the entity model work together:

* **routing**: an ``Order``'s events name their customer as a destination, and an ``EventRouter``
  delivers a copy of each into the ``Customer`` aggregate (exactly once, in order);
* **a view**: ``OrderSummary`` reads every order and payment event and answers queries;
* **reliable delivery**: placing an order makes the ``Order`` deliver a *charge* to the payment
  gateway until the gateway's confirmation is persisted as the order's ``order-paid`` event; the
  gateway stub loses the first attempt of every charge, so each one is redelivered; the ``Payment``
  entity charges each delivery id once, however often it arrives;
* **conditional requests**: after placing an order, the view and the customer are asked with the
  vector time the write returned, so their replies always include the order (read-your-writes).

Run: ``python examples/order_payment.py`` (the embedded PostgreSQL; or ``--dsn``/``JOURNAL_DSN``).
It prints each step and exits 0 only when its checks hold. Running it again (also after killing
it half-way) places nothing twice, resumes unconfirmed charges and pays nothing twice.
Events are plain dicts, so their stored form does not depend on the module's name (a dataclass
written by ``python order_payment.py`` would be stored as ``__main__:...``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from journal import (
    ConditionTimeout,
    Entity,
    EntityRegistry,
    EventRouter,
    Journal,
    VectorTime,
    View,
    after_persist,
    open_journal,
)
from journal.entities import Delivery

ORDERS: tuple[tuple[str, str, int], ...] = (
    ("o-1", "alice", 30),
    ("o-2", "bob", 12),
    ("o-3", "alice", 45),
    ("o-4", "carol", 8),
    ("o-5", "bob", 20),
    ("o-6", "alice", 5),
)
"""(order id, customer, amount): the orders the example places."""

GATEWAY = "payment-gateway"
"""The name the charges are delivered to (``registry.add_destination``)."""

Say = Callable[[str], None]


def say(line: str) -> None:
    print(line, flush=True)  # flushed: a parent process reads the steps as they happen


# -- commands (not stored) --------------------------------------------------------------------


@dataclass(frozen=True)
class PlaceOrder:
    customer: str
    amount: int


@dataclass(frozen=True)
class ConfirmCharge:
    delivery_id: str
    receipt: str


@dataclass(frozen=True)
class Charge:
    delivery_id: str
    order_id: str
    amount: int


@dataclass(frozen=True)
class Get:
    pass


# -- entities ---------------------------------------------------------------------------------


class Order(Entity[dict[str, Any] | None]):
    """One order: ``order-placed`` then, once the gateway confirms the charge, ``order-paid``.

    Both events are routed to the customer. Placing an order that exists changes nothing.
    """

    entity_type = "order"
    redeliver_interval = 0.3  # seconds between attempts of an unconfirmed charge

    def initial_state(self) -> dict[str, Any] | None:
        return None

    def on_command(self, command: object) -> object:
        match command:
            case PlaceOrder(customer, amount) if self.state is None:
                event = {"type": "order-placed", "order_id": self.entity_id, "customer": customer, "amount": amount}
                self.persist(event, destinations=[f"customer|{customer}"])
                return after_persist(lambda: self.state)
            case ConfirmCharge(delivery_id, receipt) if delivery_id in self.unconfirmed:
                assert self.state is not None
                paid = {**self.state, "type": "order-paid", "receipt": receipt}
                paid.pop("status", None)
                self.persist_confirmation(paid, delivery_id, destinations=[f"customer|{self.state['customer']}"])
                return after_persist(lambda: self.state)
            case PlaceOrder() | ConfirmCharge() | Get():
                return self.state  # already placed / a late duplicate confirmation / a read
        raise ValueError(f"unknown command {command!r}")

    def on_event(self, state: dict[str, Any] | None, event: dict[str, Any]) -> dict[str, Any] | None:
        if event["type"] == "order-placed":
            # replay asks again; a charge confirmed meanwhile is not sent again
            charge = {"order_id": event["order_id"], "customer": event["customer"], "amount": event["amount"]}
            self.deliver(f"charge-{event['order_id']}", charge, GATEWAY)
            return {**without_type(event), "status": "placed"}
        assert state is not None
        return {**state, "status": "paid", "receipt": event["receipt"]}


class Payment(Entity[dict[str, dict[str, Any]]]):
    """A customer's payment account: the charges made, by delivery id (each charged once)."""

    entity_type = "payment"

    def initial_state(self) -> dict[str, dict[str, Any]]:
        return {}

    def on_command(self, command: object) -> object:
        match command:
            case Charge(delivery_id, _, _) if delivery_id in self.state:
                return self.state[delivery_id]["receipt"]  # a redelivery: the same receipt, no new charge
            case Charge(delivery_id, order_id, amount):
                receipt = f"rcpt-{self.entity_id}-{self.sequence_nr + 1}"
                event = {"type": "charged", "delivery_id": delivery_id, "order_id": order_id}
                self.persist({**event, "amount": amount, "receipt": receipt})
                return after_persist(lambda: receipt)
            case Get():
                return self.state
        raise ValueError(f"unknown command {command!r}")

    def on_event(self, state: dict[str, dict[str, Any]], event: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {**state, event["delivery_id"]: without_type(event)}


class Customer(Entity[dict[str, Any]]):
    """Receives its orders' events by routing: what it ordered and what it paid."""

    entity_type = "customer"

    def initial_state(self) -> dict[str, Any]:
        return {"orders": [], "paid": [], "spent": 0}

    def on_command(self, command: object) -> object:
        return self.state  # Get()

    def on_event(self, state: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
        if event["type"] == "order-placed":
            return {**state, "orders": [*state["orders"], event["order_id"]]}
        if event["type"] == "order-paid":
            return {**state, "paid": [*state["paid"], event["order_id"]], "spent": state["spent"] + event["amount"]}
        return state


def without_type(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != "type"}


# -- the view ---------------------------------------------------------------------------------


class OrderSummary(View[dict[str, dict[str, Any]]]):
    """Every order with its status and the charges the payment side made for it."""

    view_id = "order-summary"
    entity_types = ("order", "payment")

    def initial_state(self) -> dict[str, dict[str, Any]]:
        return {}

    def on_event(self, state: dict[str, dict[str, Any]], event: dict[str, Any]) -> dict[str, dict[str, Any]]:
        order = dict(state.get(event["order_id"], {"charges": 0}))
        if event["type"] == "order-placed":
            order.update(customer=event["customer"], amount=event["amount"], status="placed")
        elif event["type"] == "order-paid":
            order.update(status="paid")
        else:  # charged
            order.update(charges=order["charges"] + 1)
        return {**state, event["order_id"]: order}

    def on_query(self, state: dict[str, dict[str, Any]], query: object) -> object:
        match query:
            case ("order", order_id):
                return state.get(str(order_id))
            case "totals":
                return {
                    "orders": len(state),
                    "placed": sum(o.get("amount", 0) for o in state.values()),
                    "paid": sum(o.get("amount", 0) for o in state.values() if o.get("status") == "paid"),
                    "charges": sum(o["charges"] for o in state.values()),
                }
        raise ValueError(f"unknown query {query!r}")


# -- the payment gateway (a stub that loses the first attempt) --------------------------------


class GatewayTimeout(Exception):
    """The stub's lost request: the sender hears nothing and delivers again."""


class PaymentGateway:
    """The destination of the charges: charges the customer's ``Payment`` account, then confirms
    to the order. Loses the first attempt of every charge (``flaky``); ``confirm_delay`` seconds
    between charging and confirming leave a window for a crash (the restart demo)."""

    def __init__(self, registry: EntityRegistry, say: Say, *, flaky: bool = True, confirm_delay: float = 0.0) -> None:
        self.registry = registry
        self.say = say
        self.flaky = flaky
        self.confirm_delay = confirm_delay
        self.attempts: dict[str, int] = {}
        """Delivery id -> attempts that reached the gateway in this process."""

    async def __call__(self, delivery: Delivery) -> None:
        self.attempts[delivery.delivery_id] = self.attempts.get(delivery.delivery_id, 0) + 1
        charge = delivery.message
        if self.flaky and delivery.attempt == 1:
            self.say(f"gateway: {delivery.delivery_id} attempt 1 lost (timeout); the order will deliver again")
            raise GatewayTimeout(delivery.delivery_id)
        before = await self.registry.ask(Payment, charge["customer"], Get())
        receipt = await self.registry.ask(
            Payment, charge["customer"], Charge(delivery.delivery_id, charge["order_id"], charge["amount"])
        )
        if delivery.delivery_id in before:
            self.say(f"gateway: {delivery.delivery_id} already charged ({receipt}); confirming again")
        else:
            self.say(f"gateway: charged {charge['order_id']} {charge['amount']} to {charge['customer']} ({receipt})")
        if self.confirm_delay:
            await asyncio.sleep(self.confirm_delay)
        await self.registry.ask_pid(delivery.sender, ConfirmCharge(delivery.delivery_id, receipt))


# -- the application --------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a run saw; ``ok`` when every check held (``problems`` says which did not)."""

    problems: list[str] = field(default_factory=list)
    read_your_writes: dict[str, bool] = field(default_factory=dict)
    """Order id -> the conditional read of the view included the order just placed."""
    totals: dict[str, int] = field(default_factory=dict)
    customers: dict[str, dict[str, Any]] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def check(self, holds: bool, what: str, out: Say) -> None:
        out(f"check: {what}: {'ok' if holds else 'FAILED'}")
        if not holds:
            self.problems.append(what)


async def main(
    dsn: str | None = None,
    *,
    flaky: bool = True,
    confirm_delay: float = 0.0,
    timeout: float = 60.0,  # noqa: ASYNC109 (bounds each conditional request)
    out: Say = say,
) -> Outcome:
    outcome = Outcome()
    async with open_journal(dsn) as journal, EntityRegistry(journal) as registry:
        for cls in (Order, Payment, Customer):
            registry.register(cls)
        gateway = PaymentGateway(registry, out, flaky=flaky, confirm_delay=confirm_delay)
        registry.add_destination(GATEWAY, gateway)
        async with (
            EventRouter(registry, ["order"], router_id="orders-to-customers") as router,
            OrderSummary(journal) as view,
        ):
            out("1. place the orders; read each back through the view and the customer (conditional requests)")
            for order_id, customer, amount in ORDERS:
                placed = await registry.ask_timed(Order, order_id, PlaceOrder(customer, amount))
                out(f"order {order_id}: {placed.reply['status']} {amount} for {customer} at {dict(placed.vector_time)}")
                seen = await view.ask(("order", order_id), after=placed.vector_time, timeout=timeout)
                outcome.read_your_writes[order_id] = seen is not None and seen["amount"] == amount
                out(f"  view, after that time: {seen}")
                routed = await registry.ask(Customer, customer, Get(), after=placed.vector_time, timeout=timeout)
                out(f"  customer {customer}, after that time: orders {routed['orders']}")
                outcome.check(order_id in routed["orders"], f"customer {customer} holds the routed {order_id}", out)

            out("2. wait until the view has seen every order paid (charges redelivered until confirmed)")
            # an order's history is exactly two events (placed, paid): {order|o-1: 2} means "o-1 paid"
            all_paid = {f"order|{order_id}": 2 for order_id, _, _ in ORDERS}
            try:
                await view.ask("totals", after=all_paid, timeout=timeout)
                # and every charge: the payment accounts' vector times, merged into one condition
                charges = VectorTime()
                for customer in sorted({c for _, c, _ in ORDERS}):
                    account = await registry.ask_timed(Payment, customer, Get())
                    charges = charges.merge(account.vector_time)
                    mine = {f"order|{o}": 2 for o, c, _ in ORDERS if c == customer}
                    outcome.customers[customer] = await registry.ask(
                        Customer, customer, Get(), after=mine, timeout=timeout
                    )
                outcome.totals = await view.ask("totals", after=charges, timeout=timeout)
            except ConditionTimeout as e:
                outcome.check(False, f"every order paid and routed within {timeout}s (missing {e.missing})", out)
            out(f"view totals: {outcome.totals}")
            out(f"router: {router.delivered} copies delivered, {router.duplicates} re-deliveries dropped")
            outcome.attempts = dict(gateway.attempts)
            out(f"gateway attempts in this run: {outcome.attempts}")

        out("3. checks")
        await check(journal, registry, outcome, out)
    out("all checks hold" if outcome.ok else f"{len(outcome.problems)} check(s) failed")
    return outcome


async def check(journal: Journal, registry: EntityRegistry, outcome: Outcome, out: Say) -> None:
    """The run's checks, against the journal itself where it matters (nothing paid twice)."""
    expected_total = sum(amount for _, _, amount in ORDERS)
    charges: dict[str, int] = {}
    for customer in sorted({c for _, c, _ in ORDERS}):
        async for env in journal.current_events_by_persistence_id(f"payment|{customer}"):
            charges[env.event["order_id"]] = charges.get(env.event["order_id"], 0) + 1
    for order_id, _, _ in ORDERS:
        state = await registry.ask(Order, order_id, Get())
        outcome.check(state is not None and state["status"] == "paid", f"{order_id} is paid", out)
        times = charges.get(order_id, 0)
        outcome.check(times == 1, f"{order_id} charged exactly once (journal: {times})", out)
    outcome.check(all(outcome.read_your_writes.values()), "each conditional read saw its order", out)
    totals = outcome.totals
    outcome.check(
        totals == {"orders": len(ORDERS), "placed": expected_total, "paid": expected_total, "charges": len(ORDERS)},
        f"view totals: {len(ORDERS)} orders, {expected_total} placed and paid, one charge each",
        out,
    )
    for customer, seen in outcome.customers.items():
        mine = [(o, a) for o, c, a in ORDERS if c == customer]
        holds = seen["orders"] == [o for o, _ in mine] and sorted(seen["paid"]) == sorted(o for o, _ in mine)
        holds = holds and seen["spent"] == sum(a for _, a in mine)
        outcome.check(holds, f"customer {customer}: each routed event once ({seen['spent']} spent)", out)


def no_traceback_for_lost_attempts(record: logging.LogRecord) -> bool:
    """Log the simulated lost attempts (the library logs every failed delivery) in one line."""
    if record.exc_info and isinstance(record.exc_info[1], GatewayTimeout):
        record.exc_info = None
    return True


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", help="PostgreSQL DSN (default: JOURNAL_DSN, else the embedded server)")
    parser.add_argument("--reliable-gateway", action="store_true", help="do not lose first attempts")
    parser.add_argument("--confirm-delay", type=float, default=0.0, help="seconds between charge and confirmation")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds each conditional request may wait")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.addFilter(no_traceback_for_lost_attempts)
    outcome = asyncio.run(
        main(args.dsn, flaky=not args.reliable_gateway, confirm_delay=args.confirm_delay, timeout=args.timeout)
    )
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(cli())
