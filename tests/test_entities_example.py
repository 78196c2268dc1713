"""The README's entity example and examples/bank_account.py, executed against PostgreSQL."""

from __future__ import annotations

import re
from pathlib import Path

from journal import Journal

ROOT = Path(__file__).resolve().parents[1]


def readme_entities_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Entities", 1)[1]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m is not None
    return m.group(1)


async def test_readme_example_runs(journal: Journal, dsn: str) -> None:
    ns: dict[str, object] = {}
    exec(compile(readme_entities_block(), "README.md#entities", "exec"), ns)
    await ns["demo"](dsn)  # type: ignore[operator]
    events = [e.event async for e in journal.current_events_by_persistence_id("account|alice")]
    assert events == [{"type": "deposited", "amount": 10}, {"type": "deposited", "amount": 5}]


async def test_bank_account_example(journal: Journal, dsn: str) -> None:
    import sys

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import bank_account
    finally:
        sys.path.pop(0)
    assert await bank_account.main(dsn) == 70
    envs = [e async for e in journal.current_events_by_persistence_id("account|alice")]
    assert [e.event["type"] for e in envs] == ["deposited", "transferred"]
    from journal import destinations_of

    assert destinations_of(envs[1]) == ("account|bob",)
