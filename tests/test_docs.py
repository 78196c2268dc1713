"""The user guide: its runnable examples run against the real server, and it builds strictly.

A fenced ```python block right after a ``<!-- run -->`` line in docs/*.md is runnable: it runs
in a fresh interpreter with JOURNAL_DSN pointing at the test database, and must exit 0 (the
examples assert what they show).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import truncate_all

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
RUNNABLE = re.compile(r"^<!-- run -->\n```python\n(.*?)^```", re.S | re.M)


def runnable_examples() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for page in sorted(DOCS.glob("*.md")):
        for i, m in enumerate(RUNNABLE.finditer(page.read_text()), 1):
            out.append((f"{page.stem}-{i}", m.group(1)))
    return out


EXAMPLES = runnable_examples()


def test_the_guide_has_runnable_examples() -> None:
    pages = {name.rsplit("-", 1)[0] for name, _ in EXAMPLES}
    assert {"index", "concepts", "journal", "projections", "entities", "tags", "metrics"} <= pages


@pytest.mark.parametrize(("name", "code"), EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_example_runs(name: str, code: str, dsn: str, tmp_path: Path) -> None:
    asyncio.run(truncate_all(dsn))
    env = {**os.environ, "JOURNAL_DSN": dsn}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert out.returncode == 0, f"docs example {name} failed:\n{out.stdout}\n{out.stderr}"


def test_the_guide_builds_strictly(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed in this environment (install the 'docs' or 'dev' extra)")
    out = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "api" / "index.html").exists()
