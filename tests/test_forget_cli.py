"""``journal forget`` as an operator runs it (issue 32), as a subprocess: it follows the layout
settings (JOURNAL_DATABASES: the key store is in the home database), and it refuses, with exit
code 2 and one line, what would answer success while forgetting nothing: a journal that does
not encrypt, and a subject with no stored key (unless --force)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from journal import Forgotten, JournalSettings, open_journal, slice_for
from journal.postgres.migrations import upgrade
from tests.conftest import truncate_all
from tests.support.scratch import scratch_database

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def two_dbs(server_dsn: str) -> Iterator[tuple[str, str]]:
    with contextlib.ExitStack() as stack:
        a, b = (stack.enter_context(scratch_database(server_dsn, "sjforget")) for _ in range(2))
        upgrade(a)
        upgrade(b)
        yield a, b


@pytest.fixture
async def layout(two_dbs: tuple[str, str]) -> tuple[str, str]:
    for d in two_dbs:
        await truncate_all(d)
    return two_dbs


def settings_of(dbs: tuple[str, str], **more: object) -> JournalSettings:
    return JournalSettings.load(env={}, databases=dbs, encrypt=True, **more)  # type: ignore[arg-type]


def forget(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``journal forget`` with only the given JOURNAL_ variables (the embedded server's home in tmp)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("JOURNAL_")}
    path = os.pathsep.join(p for p in (str(ROOT), base.get("PYTHONPATH", "")) if p)
    full = {**base, "PYTHONPATH": path, "XDG_DATA_HOME": str(tmp), "NO_COLOR": "1", "COLUMNS": "200", **env}
    return subprocess.run(
        [sys.executable, "-m", "journal", "forget", *args], capture_output=True, text=True, env=full, timeout=120
    )


async def events_of(dbs: tuple[str, str], pid: str) -> list[object]:
    async with open_journal(settings=settings_of(dbs)) as j:
        return [e.event async for e in j.current_events_by_persistence_id(pid)]


async def test_it_follows_journal_databases_to_the_home_key_store(layout: tuple[str, str], tmp_path: Path) -> None:
    pids = [f"Customer|c{i}" for i in (0, 1, 10, 11)]  # slices 789, 788, 196, 197
    async with open_journal(settings=settings_of(layout)) as j:
        for p in pids:
            await j.persist(p, [{"email": f"{p}@example.com"}])
    assert {slice_for(p) < 512 for p in pids} == {True, False}  # keys of both databases' pids
    databases = " ".join(layout)
    for p in pids:
        done = forget(tmp_path, p, JOURNAL_DATABASES=databases, JOURNAL_CODEC_ENCRYPT="true")
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"forgot {p}"), done.stdout
    for p in pids:
        [event] = await events_of(layout, p)
        assert isinstance(event, Forgotten), (p, event)
    assert not (tmp_path / "slice-journal").exists()  # no embedded server was started
    again = forget(tmp_path, pids[0], "--databases", databases, JOURNAL_CODEC_ENCRYPT="true")
    assert (again.returncode, again.stdout.strip()) == (0, f"{pids[0]} was already forgotten")


async def test_a_journal_without_encryption_is_refused(layout: tuple[str, str], tmp_path: Path) -> None:
    async with open_journal(settings=JournalSettings.load(env={}, databases=layout)) as j:  # type: ignore[arg-type]
        await j.persist("Customer|plain", [{"email": "plain@example.com"}])
    out = forget(tmp_path, "Customer|plain", JOURNAL_DATABASES=" ".join(layout))
    assert out.returncode == 2, out
    [line] = out.stderr.strip().splitlines()
    assert "does not encrypt" in line and "JOURNAL_CODEC_ENCRYPT" in line, line
    assert await events_of(layout, "Customer|plain") == [{"email": "plain@example.com"}]


async def test_a_subject_with_no_stored_key_is_refused_unless_forced(layout: tuple[str, str], tmp_path: Path) -> None:
    async with open_journal(settings=settings_of(layout)) as j:
        await j.persist("Customer|ann", [{"email": "ann@example.com"}])
    env = {"JOURNAL_DATABASES": " ".join(layout), "JOURNAL_CODEC_ENCRYPT": "true"}
    typo = forget(tmp_path, "Customer|an", **env)
    assert typo.returncode == 2, typo
    [line] = typo.stderr.strip().splitlines()
    assert "no key is stored for 'Customer|an'" in line and "--force" in line, line
    async with open_journal(settings=settings_of(layout)) as j:
        assert await j.key_state("Customer|an") == "none"  # nothing was marked
        assert await j.key_state("Customer|ann") == "kept"
    forced = forget(tmp_path, "Customer|an", "--force", **env)
    assert forced.returncode == 0, forced.stderr
    assert "marked forgotten" in forced.stdout
    async with open_journal(settings=settings_of(layout)) as j:
        assert await j.key_state("Customer|an") == "forgotten"
        assert [e.event async for e in j.current_events_by_persistence_id("Customer|ann")] == [
            {"email": "ann@example.com"}
        ]
