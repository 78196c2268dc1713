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
def test_example_runs_twice(name: str, code: str, dsn: str, tmp_path: Path) -> None:
    """Twice in a row on the same database, as a reader runs it twice against the embedded
    server (which keeps its data): the second run must not trip over the first one's events."""
    asyncio.run(truncate_all(dsn))
    env = {**os.environ, "JOURNAL_DSN": dsn}
    for run in ("first", "second"):
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180
        )
        assert out.returncode == 0, f"docs example {name} failed on its {run} run:\n{out.stdout}\n{out.stderr}"


def test_every_page_of_the_guide_is_linked_from_the_readme_and_the_home_page() -> None:
    """The README and docs/index.md list every page of mkdocs.yml's nav (six pages were in the
    nav only: a reader of either never found them)."""
    nav = re.findall(r"^  - .*?: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert len(nav) > 20
    pages = [p for p in nav if p != "index.md"]
    readme, home = (ROOT / "README.md").read_text(), (DOCS / "index.md").read_text()
    assert [p for p in pages if f"](docs/{p})" not in readme] == []
    assert [p for p in pages if f"]({p})" not in home] == []


NEEDS_A_BROKER = {"kafka_orders.py"}
"""Run by tests/test_kafka_example.py against the session's Kafka broker."""
SCRIPTS = sorted(
    p
    for p in (ROOT / "examples").glob("*.py")
    if '__name__ == "__main__"' in p.read_text() and p.name not in NEEDS_A_BROKER
)


def test_the_runnable_examples_are_found() -> None:
    assert {p.name for p in SCRIPTS} == {"bank_account.py", "order_payment.py"}


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_example_script_runs_twice(script: Path, dsn: str, tmp_path: Path) -> None:
    """examples/*.py twice in a row on the same database, as a reader runs them by hand."""
    asyncio.run(truncate_all(dsn))
    env = {**os.environ, "JOURNAL_DSN": dsn}
    for run in ("first", "second"):
        out = subprocess.run(
            [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, f"{script.name} failed on its {run} run:\n{out.stdout}\n{out.stderr}"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The guide built with ``mkdocs build --strict`` (once for the tests below)."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed in this environment (install the 'docs' or 'dev' extra)")
    out_dir = tmp_path_factory.mktemp("site")
    out = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(out_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return out_dir


def test_the_guide_builds_strictly(site: Path) -> None:
    assert (site / "api" / "index.html").exists()


RAW_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj|const):")
"""A reST role left as text (the docstrings' markup, not rendered)."""
MERMAID = re.compile(r"(<pre[^>]*>)?(?:<span></span>)?<code>(?:graph|flowchart|sequenceDiagram|stateDiagram)\b")
"""A diagram's source; rendered only inside ``<pre class="mermaid">`` (the superfences fence)."""
CODE = re.compile(r"<pre\b.*?</pre>", re.S)


def rendering_faults(html: str) -> list[str]:
    """What a built page shows that it should not: a fence that did not close (its backticks
    shown, as text or inside the code block that swallowed what followed), a mermaid diagram
    shown as code, a raw reST role outside code."""
    faults = []
    if "```" in html:
        faults.append(f"unclosed code fence near: {html[html.index('```') - 60 : html.index('```') + 60]!r}")
    text = CODE.sub("", html)
    faults += [f"mermaid as code: {m.group(0)!r}" for m in MERMAID.finditer(html) if "mermaid" not in (m[1] or "")]
    faults += [f"raw role {m.group(0)!r} near {html[m.start() - 40 : m.end() + 40]!r}" for m in RAW_ROLE.finditer(text)]
    return faults


def test_the_guide_renders_what_it_says(site: Path) -> None:
    pages = sorted(site.glob("**/*.html"))
    faults = {str(p.relative_to(site)): f for p in pages if (f := rendering_faults(p.read_text(encoding="utf-8")))}
    assert not faults, faults
    assert '<pre class="mermaid"><code>graph LR' in (site / "replication" / "index.html").read_text(encoding="utf-8")


def test_the_rendering_check_finds_each_fault() -> None:
    """Each kind of fault the guide once had is caught (the check itself could pass vacuously)."""
    assert rendering_faults("<p>``` Measured with the benchmark</p>")
    assert rendering_faults("<pre><code>python -c ...\n``` Measured with the benchmark</code></pre>")
    assert rendering_faults('<div class="highlight"><pre><span></span><code>graph LR\n  A --> B</code></pre></div>')
    assert rendering_faults("<p>raises :class: <code>InvalidArgument</code></p>")
    assert not rendering_faults('<pre class="mermaid"><code>graph LR</code></pre><pre><code>:class: x</code></pre>')
