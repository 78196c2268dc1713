"""docs/replication.md's entity and examples/replicated_register.py, executed."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import truncate_all
from replication_helpers import location_databases

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dbs(server_dsn: str) -> Iterator[dict[str, str]]:
    with location_databases(server_dsn, ["A", "B"]) as d:
        yield d


def test_the_docs_show_the_example_entity() -> None:
    docs = (ROOT / "docs" / "replication.md").read_text()
    block = re.search(r"```python\n(.*?)```", docs.split("## Replicated entities", 1)[1], re.S)
    assert block is not None
    assert block.group(1) in (ROOT / "examples" / "replicated_register.py").read_text()


async def test_concurrent_writes_at_two_locations_converge(dbs: dict[str, str]) -> None:
    for db in dbs.values():
        await truncate_all(db)
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import replicated_register
    finally:
        sys.path.pop(0)
    at_a, at_b = await replicated_register.main(dbs["A"], dbs["B"])
    assert at_a.state == at_b.state == {"value": "written at B"}  # the hook: the larger value
    assert at_a.vector_time == at_b.vector_time
    assert [v.concurrent for v in at_a.versions] == [False, True]
