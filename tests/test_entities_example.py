"""The guide's entity example (docs/entities.md) and examples/bank_account.py, executed against PostgreSQL."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

from journal import Journal

ROOT = Path(__file__).resolve().parents[1]


def docs_entities_block() -> str:
    text = (ROOT / "docs" / "entities.md").read_text()
    m = re.search(r"```python\n(.*?)```", text, re.S)
    assert m is not None
    return m.group(1)


async def test_docs_example_runs(journal: Journal, dsn: str) -> None:
    module = types.ModuleType("docs_entities_example")  # a real module: dataclasses look it up
    sys.modules[module.__name__] = module
    try:
        exec(compile(docs_entities_block(), "docs/entities.md", "exec"), module.__dict__)
        await module.demo(dsn)
    finally:
        del sys.modules[module.__name__]
    [alice] = [p async for p in journal.current_persistence_ids()]  # alice-<run>: a fresh id each run
    assert alice.startswith("account|alice-")
    events = [e.event async for e in journal.current_events_by_persistence_id(alice)]
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
