"""The command lines take the library's hooks by import path (issue 32, item 4): customer-level
subjects (``subject_of``), upcasters and serializers, as options or from the environment, for
``projections run`` and ``dead-letters retry``; a hook that cannot be loaded is one line, exit 2.
Every command runs as a subprocess against an encrypted journal holding version-1 rows."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import asyncpg
import pytest

from journal import Journal, JournalSettings, open_journal
from tests.hooks_app import CREATE, PlacedV1, customer
from tests.projection_helpers import FAST_ENV, spawn_worker, stop
from tests.support.waiting import wait_until

ENCRYPTED = {"JOURNAL_CODEC_ENCRYPT": "1"}
HOOK_OPTIONS = [
    "--subject-of", "tests.hooks_app:customer", "--upcasters", "tests.hooks_app:UPCASTERS",
    "--serializers", "tests.hooks_app:registry",
]  # fmt: skip
HOOK_ENV = {
    "JOURNAL_SUBJECT_OF": "tests.hooks_app:customer",
    "JOURNAL_UPCASTERS": "tests.hooks_app:UPCASTERS",
    "JOURNAL_SERIALIZERS": "tests.hooks_app:registry",
}


@pytest.fixture
async def conn(journal: Journal, dsn: str) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(dsn)
    await c.execute(CREATE)
    await c.execute("TRUNCATE hooks_projected")
    yield c
    await c.close()


async def write_v1(dsn: str) -> set[tuple[str, int]]:
    """Version-1 rows of two customers' orders, encrypted with the customer's key; one poisoned."""
    settings = JournalSettings.load(env={}, dsn=dsn, encrypt=True)
    async with open_journal(dsn, settings=settings, subject_of=customer) as j:
        for pid in ("Yrs|ann-1", "Yrs|ann-2", "Yrs|bob-1"):
            await j.persist(pid, [PlacedV1(pid, 2), PlacedV1(pid, 3, "poison" if pid == "Yrs|ann-2" else "")])
    return {(pid, s) for pid in ("Yrs|ann-1", "Yrs|ann-2", "Yrs|bob-1") for s in (1, 2)}


def _cli(dsn: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "projections", *args, "--dsn", dsn], capture_output=True, text=True, timeout=120,
        env={**os.environ, **FAST_ENV, **ENCRYPTED, **(env or {})},
    )  # fmt: skip


async def projected(conn: asyncpg.Connection) -> dict[tuple[str, int], int]:
    return {(r[0], r[1]): r[2] for r in await conn.fetch("SELECT pid, seq, items FROM hooks_projected")}


async def test_run_and_retry_take_subjects_upcasters_and_serializers(conn: asyncpg.Connection, dsn: str) -> None:
    """``projections run`` with the hooks as options projects every upcast event of the
    customer-keyed journal (before: no such options; without them it exits 1 having applied
    nothing, ``no key of 'YrsCust|ann'``); the poisoned one is dead-lettered, and
    ``dead-letters retry`` with the hooks from the environment applies it."""
    events = await write_v1(dsn)
    poison = ("Yrs|ann-2", 2)
    worker = spawn_worker(
        dsn, "hooks", "Yrs", "tests.hooks_app:project",
        extra=[*HOOK_OPTIONS, "--on-failure", "retry-and-dead-letter:1"], env=ENCRYPTED,
    )  # fmt: skip
    try:
        await wait_until(lambda: _has(conn, events - {poison}, worker), 60, "the upcast events projected")
    finally:
        stop([worker])
    assert worker.returncode == 0
    got = await projected(conn)
    assert got == {(pid, s): 2 if s == 1 else 3 for pid, s in events - {poison}}  # items: upcast from quantity
    sealed = await asyncio.to_thread(_cli, dsn, "dead-letters", "list", "hooks")  # the pid is no subject
    assert "Yrs|ann-2 #2" in sealed.stdout and "ValueError" not in sealed.stdout, sealed.stdout
    assert "a sealed text that does not open" in sealed.stdout
    subjects = ["--subject-of", "tests.hooks_app:customer"]
    listed = await asyncio.to_thread(_cli, dsn, "dead-letters", "list", "hooks", *subjects)
    assert "Yrs|ann-2 #2" in listed.stdout and "ValueError" in listed.stdout, listed.stdout
    fixed = ["dead-letters", "retry", "hooks", "--handler", "tests.hooks_app:project_fixed"]
    bare = await asyncio.to_thread(_cli, dsn, *fixed)  # no hooks: the pid is no subject, its key is not found
    assert bare.returncode == 1 and "no key of 'Yrs|ann-2'" in bare.stderr
    done = await asyncio.to_thread(_cli, dsn, *fixed, env=HOOK_ENV)
    assert done.returncode == 0, done.stderr
    assert "applied 1, failed 0" in done.stdout
    assert (await projected(conn))[poison] == 3


async def _has(conn: asyncpg.Connection, wanted: set[tuple[str, int]], worker: subprocess.Popen[bytes]) -> bool:
    assert worker.poll() is None, "the worker exited"
    return set(await projected(conn)) >= wanted


@pytest.mark.parametrize(
    ("hook", "spec", "message"),
    [
        ("--subject-of", "nowhere.hooks:customer", "subject_of 'nowhere.hooks:customer': module 'nowhere.hooks' "
         "not found"),
        ("--upcasters", "tests.hooks_app:MISSING", "upcasters 'tests.hooks_app:MISSING': module 'tests.hooks_app' "
         "has no attribute 'MISSING'"),
        ("--serializers", "tests.hooks_app:NOT_A_REGISTRY", "serializers 'tests.hooks_app:NOT_A_REGISTRY' is a int, "
         "not a SerializerRegistry"),
        ("--subject-of", "tests.hooks_app:NOT_A_REGISTRY", "subject_of 'tests.hooks_app:NOT_A_REGISTRY' is a int, "
         "not a function"),
        ("--subject-of", "tests.hooks_app:registry", "subject_of 'tests.hooks_app:registry' cannot be called with "
         "one argument"),
        ("--upcasters", "no-colon", "upcasters must look like 'package.module:attribute', got 'no-colon'"),
    ],
)  # fmt: skip
def test_a_hook_that_cannot_be_loaded_is_one_line_and_exit_2(dsn: str, hook: str, spec: str, message: str) -> None:
    for args in (["run", "h", "--entity-type", "Yrs", "--handler", "tests.hooks_app:project", hook, spec],
                 ["dead-letters", "retry", "h", "--handler", "tests.hooks_app:project_fixed", hook, spec]):  # fmt: skip
        out = _cli(dsn, *args)
        assert out.returncode == 2, (args, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], out.stderr


def test_a_hook_from_the_environment_is_checked_the_same_way(dsn: str) -> None:
    out = _cli(dsn, "run", "h", "--entity-type", "Yrs", "--handler", "tests.hooks_app:project",
               env={"JOURNAL_UPCASTERS": "tests.hooks_app:Placed"})  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip() == (
        "error: upcasters 'tests.hooks_app:Placed': calling it failed: TypeError: "
        "Placed.__init__() missing 2 required positional arguments: 'customer' and 'items'"
    )
