"""examples/order_payment.py (routing, a view, confirmed delivery and conditional requests together),
run in-process and as a script against the test database, killed half-way and run again."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from journal import Journal, routed_from

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "order_payment.py"


@pytest.fixture(scope="module")
def example() -> Iterator[ModuleType]:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import order_payment
    finally:
        sys.path.pop(0)
    yield order_payment


async def ledger(journal: Journal, example: ModuleType) -> dict[str, Any]:
    """What the journal holds: each order's event types, the charges per order, each customer's
    routed copies (source pid, seq_nr)."""
    orders = {}
    for order_id, _, _ in example.ORDERS:
        orders[order_id] = [
            e.event["type"] async for e in journal.current_events_by_persistence_id(f"order|{order_id}")
        ]
    charges: dict[str, int] = {}
    copies: dict[str, list[tuple[str, int] | None]] = {}
    for customer in sorted({c for _, c, _ in example.ORDERS}):
        async for e in journal.current_events_by_persistence_id(f"payment|{customer}"):
            charges[e.event["order_id"]] = charges.get(e.event["order_id"], 0) + 1
        copies[customer] = [
            routed_from(e) async for e in journal.current_events_by_persistence_id(f"customer|{customer}")
        ]
    return {"orders": orders, "charges": charges, "copies": copies}


def assert_all_paid_once(held: dict[str, Any], example: ModuleType) -> None:
    ids = [o for o, _, _ in example.ORDERS]
    assert held["orders"] == {o: ["order-placed", "order-paid"] for o in ids}
    assert held["charges"] == dict.fromkeys(ids, 1)
    for customer, got in held["copies"].items():
        mine = [o for o, c, _ in example.ORDERS if c == customer]
        # each order's two events routed to its customer exactly once
        assert sorted(c for c in got if c is not None) == sorted((f"order|{o}", n) for o in mine for n in (1, 2))
        assert None not in got


async def test_example_runs_and_checks_hold(journal: Journal, dsn: str, example: ModuleType) -> None:
    lines: list[str] = []
    outcome = await example.main(dsn, out=lines.append)
    assert outcome.ok, (outcome.problems, lines)
    assert lines[-1] == "all checks hold"
    n, total = len(example.ORDERS), sum(a for _, _, a in example.ORDERS)
    assert outcome.read_your_writes == {o: True for o, _, _ in example.ORDERS}
    assert outcome.totals == {"orders": n, "placed": total, "paid": total, "charges": n}
    assert outcome.customers["alice"]["spent"] == 80
    # the gateway lost every first attempt: each charge was delivered again until confirmed
    assert outcome.attempts == {f"charge-{o}": 2 for o, _, _ in example.ORDERS}
    assert sum("attempt 1 lost" in line for line in lines) == n
    held = await ledger(journal, example)
    assert_all_paid_once(held, example)

    # run again: everything is there already; nothing is placed, charged or delivered again
    again: list[str] = []
    outcome = await example.main(dsn, out=again.append)
    assert outcome.ok, (outcome.problems, again)
    assert outcome.attempts == {}
    assert await ledger(journal, example) == held


async def run_script(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(SCRIPT), *args, cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


async def test_killed_half_way_then_run_again_loses_nothing_and_pays_nothing_twice(
    journal: Journal, dsn: str, example: ModuleType
) -> None:
    # first run: confirmations take 10 minutes, so charges are made but never confirmed; kill it
    # (SIGKILL: no clean stop) once two orders are charged
    first = await run_script("--dsn", dsn, "--confirm-delay", "600")
    assert first.stdout is not None
    charged: list[str] = []
    seen: list[bytes] = []
    try:
        async with asyncio.timeout(120):
            while len(charged) < 2:
                line = await first.stdout.readline()
                assert line, (b"".join(seen), await first.stderr.read() if first.stderr else b"")
                seen.append(line)
                if m := re.match(rb"gateway: charged (\S+) ", line):
                    charged.append(m.group(1).decode())
    finally:
        first.kill()
        await first.communicate()
    before = await ledger(journal, example)
    assert all(before["charges"].get(o) == 1 for o in charged), before
    assert not any("order-paid" in types for types in before["orders"].values()), before  # none confirmed

    # second run: places what is missing, redelivers the unconfirmed charges (the payment side
    # recognises those already made) and exits 0 only when its checks hold
    second = await run_script("--dsn", dsn)
    out, err = await asyncio.wait_for(second.communicate(), 180)
    text = out.decode()
    assert second.returncode == 0, text + err.decode()
    assert text.rstrip().endswith("all checks hold"), text
    for o in charged:
        assert f"gateway: charge-{o} already charged" in text, text
    assert_all_paid_once(await ledger(journal, example), example)


async def test_the_script_exits_1_when_a_check_fails(journal: Journal, dsn: str, example: ModuleType) -> None:
    # a double charge already in the journal: the run completes, its check finds it
    charge = {"type": "charged", "delivery_id": "charge-o-1", "order_id": "o-1", "amount": 30, "receipt": "r"}
    await journal.persist("payment|alice", [charge, charge])
    proc = await run_script("--dsn", dsn, "--reliable-gateway")
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    text = out.decode()
    assert proc.returncode == 1, text + err.decode()
    assert "check: o-1 charged exactly once (journal: 2): FAILED" in text
    assert "check: o-2 charged exactly once (journal: 1): ok" in text
    assert text.rstrip().endswith("check(s) failed")


def test_the_guide_page_quotes_the_example() -> None:
    """Every Python excerpt in docs/example-order-payment.md is in the example as it is written."""
    page = (ROOT / "docs" / "example-order-payment.md").read_text()
    source = SCRIPT.read_text()
    excerpts = re.findall(r"```python\n(.*?)```", page, re.S)
    assert len(excerpts) >= 8
    for excerpt in excerpts:
        assert excerpt in source, excerpt
