"""open_journal freezes the startup heap once per process (``write.freeze_heap``): a process
that writes through the journal does not walk its imported modules in every full collection.
Each case runs in a fresh interpreter, since the test process's heap may be frozen already."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROGRAM = """
import asyncio, gc, sys
from journal import open_journal

async def main() -> None:
    before = gc.get_freeze_count()
    async with open_journal(sys.argv[1], freeze_heap=sys.argv[2] == "on"):
        print(before, gc.get_freeze_count())

asyncio.run(main())
"""


def frozen_counts(dsn: str, setting: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", PROGRAM, dsn, setting], capture_output=True, text=True, check=True)
    before, after = out.stdout.split()
    return int(before), int(after)


@pytest.mark.parametrize("setting", ["on", "off"])
def test_open_journal_freezes_the_heap_unless_told_not_to(dsn: str, setting: str) -> None:
    before, after = frozen_counts(dsn, setting)
    assert before == 0
    if setting == "on":
        assert after > 10_000  # the imported modules at least
    else:
        assert after == 0
