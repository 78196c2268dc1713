"""The code stays ruff-clean and mypy-clean (strict) — checked in CI like any other test."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.skip(f"{name} is not installed in this environment (install the 'dev' extra)")
    return path


def test_ruff() -> None:
    out = subprocess.run(
        [_tool("ruff"), "check", "."],  # everything: alembic/ and docs/hooks/ too
        cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_ruff_format() -> None:
    """One layout everywhere (the pinned ruff's), so a diff shows only what changed."""
    out = subprocess.run([_tool("ruff"), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict() -> None:
    out = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_import_contracts() -> None:
    """The layers, `journal` never importing `projections`, no cycles (pyproject.toml, [tool.importlinter])."""
    out = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout, out.stdout


SQL_HOMES = (
    "journal/postgres/",
    "journal/cassandra/",
    "projections/postgres_store.py",
    "projections/tag_offset_store.py",
    "projections/dead_letter_store.py",
    "projections/parked_store.py",
    "projections/version_store.py",
    "projections/spark/sql.py",
    "projections/demo/statements.py",
)
"""Where SQL and CQL may be written: the backends, the projection offset stores, the Spark SQL and
the demo read model's statements (docs/contributing.md, "Where SQL lives")."""

_SQL = re.compile(r"^\s*(SELECT\s|INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM|CREATE\s|ALTER\s|DROP\s|TRUNCATE\s)")


def _sql_literals(path: Path) -> list[int]:
    """Line numbers of string literals (not docstrings) that start like a SQL statement."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    lines = []
    for node in ast.walk(tree):
        parts: list[str] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            parts = [node.value]
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            parts = [str(node.values[0].value)]
        if any(_SQL.match(p) for p in parts):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_sql_only_in_backend_modules() -> None:
    found = {}
    for package in ("journal", "projections"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(SQL_HOMES):
                continue
            lines = _sql_literals(path)
            if lines:
                found[rel] = lines
    assert found == {}, f"SQL outside its homes {SQL_HOMES}: {found}"


def test_sql_check_finds_sql(tmp_path: Path) -> None:
    """The check above is not vacuous: it sees a statement in a plain string and in an f-string."""
    probe = tmp_path / "probe.py"
    probe.write_text('"""SELECT in a docstring is prose."""\nA = "SELECT 1"\nB = f"DELETE FROM {A} WHERE x"\n')
    assert _sql_literals(probe) == [2, 3]


def test_no_plain_runtime_errors() -> None:
    """Errors raised to users come from the journal.errors tree, never a bare RuntimeError/Exception."""
    plain = {"RuntimeError", "Exception", "BaseException"}
    found = []
    for package in ("journal", "projections"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Raise) and node.exc is not None:
                    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                    if isinstance(exc, ast.Name) and exc.id in plain:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


WRITE_PATH = (
    "journal/journal.py",
    "journal/bulk.py",
    "journal/write_validation.py",
    "journal/write_batch.py",
    "journal/serialization.py",
    "journal/envelope.py",
    "journal/group_commit.py",
    "journal/metrics.py",
    "journal/postgres/writes.py",
    "journal/postgres/bulk_writes.py",
    "journal/postgres/write_statements.py",
    "journal/postgres/timestamp_rule.py",
    "journal/postgres/replicated_insert.py",
    "journal/postgres/replication_store.py",
    "journal/postgres/replication_part.py",
    "journal/postgres/replication_sql.py",
    "journal/postgres/writer_connections.py",
    "journal/cassandra/writes.py",
)
"""The modules a write goes through, from the facade to the statements (docs/architecture.md,
"The route of a write")."""


def _worse_than_c(paths: list[Path]) -> list[str]:
    """Radon's cyclomatic complexity: the functions of ``paths`` that rank worse than C (over 20)."""
    from radon.complexity import cc_rank, cc_visit

    return [
        f"{path.relative_to(ROOT)}: {block.fullname} {cc_rank(block.complexity)} ({block.complexity})"
        for path in paths
        for block in cc_visit(path.read_text())
        if block.complexity > 20
    ]


def test_write_path_functions_rank_c_or_better() -> None:
    """No function of the write path ranks worse than C."""
    assert _worse_than_c([ROOT / module for module in WRITE_PATH]) == []


def test_projections_functions_rank_c_or_better() -> None:
    """No function of the projections package ranks worse than C (issue 33: the runner's parts)."""
    assert _worse_than_c(sorted((ROOT / "projections").rglob("*.py"))) == []


MAX_CLASS_LINES = 400


def _class_lines(node: ast.ClassDef) -> int:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return (node.end_lineno or node.lineno) - first + 1


def _classes_over(path: Path, limit: int) -> list[str]:
    """The classes of ``path`` longer than ``limit`` lines (decorators and docstring included)."""
    classes = [node for node in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(node, ast.ClassDef)]
    return [f"{path.name}: {c.name} ({_class_lines(c)} lines)" for c in classes if _class_lines(c) > limit]


def test_no_projections_class_over_400_lines() -> None:
    """A class of the projections package stays readable in one sitting (issue 33)."""
    found = [c for path in sorted((ROOT / "projections").rglob("*.py")) for c in _classes_over(path, MAX_CLASS_LINES)]
    assert found == []


def test_the_class_size_check_sees_a_long_class(tmp_path: Path) -> None:
    """The check above is not vacuous: a class of 5 lines is over a limit of 4, not of 5."""
    probe = tmp_path / "probe.py"
    probe.write_text("@decorated\nclass A:\n    x = 1\n\n    y = 2\n")
    assert _classes_over(probe, 4) == ["probe.py: A (5 lines)"]
    assert _classes_over(probe, 5) == []


def test_the_rank_check_sees_a_complex_function() -> None:
    """The check above is not vacuous: radon ranks a function of 21 branches D."""
    from radon.complexity import cc_rank, cc_visit

    source = "def f(x):\n" + "".join(f"    if x == {i}:\n        return {i}\n" for i in range(20))
    (block,) = cc_visit(source)
    assert block.complexity == 21 and cc_rank(block.complexity) == "D"
