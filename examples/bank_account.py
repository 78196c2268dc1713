"""Example service: bank accounts as event-sourced entities (used by README, "Entities").

Run: ``JOURNAL_DSN=postgresql://... python examples/bank_account.py`` (no DSN: embedded PostgreSQL).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from journal import Entity, EntityRegistry, after_persist, open_journal


@dataclass(frozen=True)
class Deposit:
    amount: int


@dataclass(frozen=True)
class Withdraw:
    amount: int


@dataclass(frozen=True)
class Transfer:
    to_account: str
    amount: int


@dataclass(frozen=True)
class GetBalance:
    pass


class InsufficientFunds(Exception):
    pass


class BankAccount(Entity[int]):
    """State: the balance. Events: plain dicts (JSON)."""

    entity_type = "account"
    snapshot_every = 100

    def initial_state(self) -> int:
        return 0

    def on_command(self, command: object) -> object:
        match command:
            case Deposit(amount) if amount > 0:
                self.persist({"type": "deposited", "amount": amount})
                return after_persist(lambda: self.state)
            case Withdraw(amount) | Transfer(_, amount) if amount > self.state:
                raise InsufficientFunds(f"balance {self.state} < {amount}")
            case Withdraw(amount):
                self.persist({"type": "withdrawn", "amount": amount})
                return after_persist(lambda: self.state)
            case Transfer(to, amount):
                # routed: stored with the event, so a consumer of "account|<to>" sees it too
                self.persist(
                    {"type": "transferred", "to": to, "amount": amount},
                    destinations=[f"account|{to}"],
                )
                return after_persist(lambda: self.state)
            case GetBalance():
                return self.state
        raise ValueError(f"unknown command {command!r}")

    def on_event(self, state: int, event: dict[str, object]) -> int:
        amount = event["amount"]
        assert isinstance(amount, int)
        return state + amount if event["type"] == "deposited" else state - amount


async def main(dsn: str | None = None) -> int:
    async with open_journal(dsn) as journal, EntityRegistry(journal) as accounts:
        await accounts.ask(BankAccount, "alice", Deposit(100))
        await accounts.ask(BankAccount, "alice", Transfer("bob", 30))
        try:
            await accounts.ask(BankAccount, "alice", Withdraw(500))
        except InsufficientFunds as e:
            print("refused:", e)
        balance: int = await accounts.ask(BankAccount, "alice", GetBalance())
        print("alice has", balance)
        return balance


if __name__ == "__main__":
    asyncio.run(main())
