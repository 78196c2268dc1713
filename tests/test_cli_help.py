"""Every command's ``--help`` is readable in an 80-column terminal (issue 32, item 8): lines wrap,
nothing is cut. Before, rich's tables cut option names and help at 80 columns
(``--metrics-inter…``, ``retry-and-dead-le…``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import typer
from typer.core import TyperGroup

from journal.cli import app as journal_app
from projections.cli import app as projections_app


def commands(group: object, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = [path]
    if isinstance(group, TyperGroup):
        for name, sub in group.commands.items():
            out += commands(sub, (*path, name))
    return out


ALL = [("journal", *p) for p in commands(typer.main.get_command(journal_app))] + [
    ("projections", *p) for p in commands(typer.main.get_command(projections_app))
]


def test_every_command_is_listed() -> None:
    assert ("projections", "run") in ALL and ("projections", "dead-letters", "retry") in ALL
    assert ("journal", "cleanup", "delete-all") in ALL and len(ALL) > 25


@pytest.mark.parametrize("command", ALL, ids=[" ".join(c) for c in ALL])
def test_help_fits_80_columns_uncut(command: tuple[str, ...]) -> None:
    module, *args = command
    out = subprocess.run(
        [sys.executable, "-m", module, *args, "--help"], capture_output=True, text=True, timeout=60,
        env={**os.environ, "COLUMNS": "80", "TERM": "xterm-256color"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line for line in lines if len(line) > 80] == []
    assert "…" not in out.stdout  # rich's ellipsis: a cut option or help text
    cmd = typer.main.get_command(journal_app if module == "journal" else projections_app)
    for name in args:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    words = " ".join(out.stdout.split())
    for param in cmd.params:
        if getattr(param, "hidden", False):  # a deprecated spelling, not shown
            continue
        for opt in param.opts:
            if opt.startswith("--"):
                assert opt in words, (opt, out.stdout)
        if param.help:  # its whole help, as wrapped words
            assert " ".join(param.help.split()) in words, (param.help, out.stdout)
