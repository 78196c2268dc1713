"""The README's commands and examples are the ones that work."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import truncate_all

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _first_block() -> list[str]:
    block = re.search(r"```bash\n(.*?)```", README, re.S)
    assert block, "README must open with a bash block"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_the_demo_and_the_test_command() -> None:
    demo, tests = _first_block()[:2]
    assert demo.endswith("journal demo") and "python3 -m venv .venv" in demo
    assert "pytest" in tests and "python3 -m venv .venv" in tests
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci.splitlines(), ".ci/run must run exactly the README's test command"


def test_the_journal_example_runs(dsn: str) -> None:
    asyncio.run(truncate_all(dsn))
    section = README.split("## The journal", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code
    env = {**os.environ, "JOURNAL_DSN": dsn}
    out = subprocess.run(
        [sys.executable, "-c", code.group(1)], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    lines = out.stdout.splitlines()
    assert lines[0].startswith("2 ")
    assert lines[1:] == ["1 {'added': 'apple'}", "2 {'added': 'pear'}", "3 {'removed': 'pear'}"]


def test_readme_is_a_front_page() -> None:
    """A few hundred lines at most, and no development diary (commit hashes, issue numbers)."""
    assert len(README.splitlines()) <= 300
    assert not re.search(r"\b[0-9a-f]{7,40}\b", README), "a commit hash in the README"
    assert not re.search(r"\bissue \d+", README, re.I), "an issue number in the README"
    for page in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / page).is_file(), f"README links to a missing page: {page}"


def test_the_bulk_example_runs(dsn: str) -> None:
    """The README's persist_many lines, run inside a journal ``j`` as the text around them says."""
    asyncio.run(truncate_all(dsn))
    section = README.split("## The journal", 1)[1]
    snippet = re.findall(r"```python\n(.*?)```", section, re.S)[1]
    body = "\n".join("        " + line for line in snippet.splitlines())
    program = (
        "import asyncio\nfrom journal import open_journal\n\nasync def main() -> None:\n"
        f"    async with open_journal() as j:\n{body}\n"
        "        again = await j.persist_many([Write('order|7', [{'placed': 7}], expected_seq_nr=0)])\n"
        "        print(failures(again))\n\nasyncio.run(main())\n"
    )
    env = {**os.environ, "JOURNAL_DSN": dsn}
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[(0, SequenceConflict("), lines
