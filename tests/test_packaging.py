"""The wheel carries the migrations, and `journal migrate` works from it (no source checkout)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_ships_migrations_and_cql_and_migrates_from_an_install(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("slice_journal-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "journal/_alembic/env.py" in names
    assert any(n.startswith("journal/_alembic/versions/0001_") for n in names)
    assert {"journal/cassandra/schema.cql", "journal/cassandra/statements.cql"} <= names
    (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    declared = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "[slice_journal.cli]\ndemo = projections.demo.command:register" in declared, declared
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = "import journal, sys; print(journal.__file__)"
    where = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert where.stdout.startswith(str(target)), "the installed copy, not the checkout, must be imported"
    out = subprocess.run(
        [sys.executable, "-c", "from journal.cli import main; main()", "migrate", "--sql", "--schema", "svc"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert "CREATE TABLE event_journal" in out.stdout and 'CREATE SCHEMA IF NOT EXISTS "svc"' in out.stdout
    help_ = subprocess.run(
        [sys.executable, "-c", "from journal.cli import main; main()", "demo", "--help"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert "--scale-to" in help_.stdout, "`journal demo` comes from projections through the entry point"


def test_journal_cli_adds_the_demo_from_its_entry_point_group() -> None:
    """`journal demo` lives in projections; the journal CLI finds it by the entry-point group only."""
    from importlib.metadata import entry_points

    from typer.testing import CliRunner

    from journal.cli import ENTRY_POINT_GROUP, app

    (demo,) = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == "demo"]
    assert demo.value == "projections.demo.command:register"
    out = CliRunner().invoke(app, ["demo", "--help"])
    assert out.exit_code == 0, out.output
    assert "--scale-to" in out.output
