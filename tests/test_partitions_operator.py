"""The journal over several databases as an operator meets it (issue 31, items 4-8), on two real
PostgreSQL servers that ask every client for a password (SCRAM over TCP), through the real
command lines run as subprocesses: credentials that survive a move without being stored, the
demo's databases its own, every command following the layout, one database down failing its
own slices only, and bad input said in one line with the right exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from journal import JournalSettings, open_journal, slice_for
from journal.postgres import asyncpg_dsn, schema_migrations
from tests.support.password_server import PasswordServer, password_server
from tests.support.scratch import scratch_database

PASSWORDS = ("s3cret-a", "s3cret-b")


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[PasswordServer, PasswordServer]]:
    """Two servers, each with its own password for the role ``app``."""
    with password_server(password=PASSWORDS[0]) as a, password_server(password=PASSWORDS[1]) as b:
        yield a, b


@dataclass
class Layout:
    """Two journal databases (one per server), a move's target beside the second, a home of its own."""

    a: str
    b: str
    target: str
    env: dict[str, str]

    def run(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", *args], env=env or self.env, capture_output=True, text=True, timeout=timeout
        )


def clean_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment of a command: no JOURNAL_ or PG variable of this process, a data home of
    its own (the embedded server, if anything started it, is a throwaway one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOURNAL_", "PG"))}
    return {**env, "XDG_DATA_HOME": str(tmp / "xdg"), "HOME": str(tmp), **extra}


@pytest.fixture
def layout(servers: tuple[PasswordServer, PasswordServer], tmp_path: Path) -> Iterator[Layout]:
    a, b = servers
    with contextlib.ExitStack() as stack:
        da = stack.enter_context(scratch_database(a.dsn(), "sjopa"))
        db = stack.enter_context(scratch_database(b.dsn(), "sjopb"))
        target = stack.enter_context(scratch_database(b.dsn(), "sjope"))
        for d in (da, db):
            schema_migrations().upgrade(d)
        yield Layout(da, db, target, clean_env(tmp_path, JOURNAL_DATABASES=f"{da} {db}"))


def no_password(*texts: str) -> None:
    for t in texts:
        for p in PASSWORDS:
            assert p not in t, f"a password was printed: {t!r}"


def pids_in(lo: int, hi: int, n: int, prefix: str = "Cart") -> list[str]:
    out = []
    i = 0
    while len(out) < n:
        p = f"{prefix}|{i:x}-{i * 7919:x}"
        if lo <= slice_for(p) <= hi:
            out.append(p)
        i += 1
    return out


# -- 4: credentials survive a move without being stored -------------------------------------------


def test_a_move_to_a_password_protected_database_is_served_with_the_listed_passwords(layout: Layout) -> None:
    moved = pids_in(512, 767, 5)
    settings = JournalSettings.load(env={}, databases=[layout.a, layout.b])

    async def write(pids: list[str]) -> None:
        async with open_journal(layout.a, settings=settings) as j:
            for p in pids:
                await j.persist(p, [{"n": 1}])

    asyncio.run(write(moved))
    r = layout.run("journal", "partitions", "move", "--slices", "512-767", "--to", layout.target)
    no_password(r.stdout, r.stderr)
    assert r.returncode == 0, r.stderr
    assert "moved slices 512-767" in r.stdout

    # the map names the target without its password
    async def stored_locations() -> list[str]:
        conn = await asyncpg.connect(asyncpg_dsn(layout.b))
        try:
            return [
                str(x[0]) for x in await conn.fetch("SELECT location FROM slice_partition WHERE location IS NOT NULL")
            ]
        finally:
            await conn.close()

    locations = asyncio.run(stored_locations())
    assert locations and all(PASSWORDS[1] not in loc for loc in locations)

    # a new process finds the target's password among the listed DSNs (same server and role)
    show = layout.run("journal", "partitions", "show")
    no_password(show.stdout, show.stderr)
    assert show.returncode == 0, show.stderr
    assert "(being switched)" not in show.stdout and "password authentication failed" not in show.stdout
    assert "unavailable" not in show.stdout
    assert "sjope" in show.stdout

    async def write_and_read() -> tuple[int, int]:
        async with open_journal(layout.a, settings=settings) as j:
            for p in moved:
                await j.persist(p, [{"n": 2}])
            return len([e async for e in j.current_events_by_persistence_id(moved[0])]), j.backend.dbs.map.epoch  # type: ignore[attr-defined]

    events, epoch = asyncio.run(write_and_read())
    assert (events, epoch) == (2, 1)

    # running the same move again says it is done, not "not served by one database"
    again = layout.run("journal", "partitions", "move", "--slices", "512-767", "--to", layout.target)
    no_password(again.stdout, again.stderr)
    assert again.returncode == 2 and "already served by" in again.stderr, again.stderr


def test_spark_reads_every_database_with_its_password(layout: Layout, tmp_path: Path) -> None:
    """The JDBC sources of a moved range carry the password found for it (JDBC ignores
    PGPASSWORD); a password-less list finds them in libpq's password file."""
    from projections.spark.placement import placement

    settings = JournalSettings.load(env={}, databases=[layout.a, layout.b])

    async def move_and_place() -> list[tuple[int, int, str | None]]:
        from journal.backends import open_partitioned
        from journal.partitioned.move import SliceMove

        backend = await open_partitioned(layout.a, settings)
        try:
            await SliceMove(backend, 512, 767, layout.target, say=lambda _: None).run()
        finally:
            await backend.close()
        async with open_journal(layout.a, settings=settings) as j:
            return [(p.min_slice, p.max_slice, p.source.properties.get("password")) for p in await placement(j)]

    assert asyncio.run(move_and_place()) == [
        (0, 511, PASSWORDS[0]),
        (512, 767, PASSWORDS[1]),
        (768, 1023, PASSWORDS[1]),
    ]


# -- 8: bad input ---------------------------------------------------------------------------------


def test_databases_separated_by_commas_are_one_line_without_a_password(layout: Layout) -> None:
    env = {**layout.env, "JOURNAL_DATABASES": f"{layout.a},{layout.b}"}
    for args in (("journal", "info"), ("journal", "partitions", "show"), ("projections", "status")):
        r = layout.run(*args, env=env)
        no_password(r.stdout, r.stderr)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "separate" in r.stderr and "spaces" in r.stderr


def test_a_move_to_a_database_that_does_not_exist_is_bad_input(layout: Layout) -> None:
    missing = layout.target.rsplit("/", 1)[0] + "/no_such_database"
    r = layout.run("journal", "partitions", "move", "--slices", "512-767", "--to", missing)
    no_password(r.stdout, r.stderr)
    assert r.returncode == 2, r.stderr
    assert 'database "no_such_database" does not exist' in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("dry_run", [(), ("--dry-run",)], ids=["move", "dry run"])
def test_a_move_to_a_silent_server_says_what_it_waits_for_within_10_s(layout: Layout, dry_run: tuple[str, ...]) -> None:
    """A server that accepts TCP and never answers: the tool names what it waits for at once,
    then fails as unavailable (exit 3) instead of hanging."""
    import socket

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        to = f"postgresql://app:{PASSWORDS[1]}@127.0.0.1:{port}/journal_e"
        env = {**layout.env, "JOURNAL_CONNECT_TIMEOUT": "2", "JOURNAL_RETRY_BUDGET": "3"}
        started = time.monotonic()
        p = subprocess.Popen(
            [sys.executable, "-m", "journal", "partitions", "move", "--slices", "512-767", "--to", to, *dry_run],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            assert p.stdout is not None
            first = p.stdout.readline()
            said_after = time.monotonic() - started
            rest, _ = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
    no_password(first, rest)
    assert said_after < 10, (said_after, first)
    assert f"127.0.0.1:{port}/journal_e" in first, first
    assert p.returncode == 3, rest
    assert "no answer within 2 s" in rest, rest


def test_a_password_less_dsn_finds_its_password_in_libpqs_password_file(
    layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """libpq's password file (escapes and ``*`` as libpq reads them) for asyncpg and for JDBC."""
    from urllib.parse import urlsplit

    from journal.postgres import Passwords
    from projections.spark.jdbc import jdbc_source

    parts = urlsplit(layout.b)
    bare = layout.b.replace(f":{PASSWORDS[1]}@", "@")
    passfile = tmp_path / "pgpass"
    passfile.write_text(
        f"# a comment\nother\\:host:*:*:app:wrong\n{parts.hostname}:{parts.port}:*:app:{PASSWORDS[1]}\n"
    )
    passfile.chmod(0o600)
    filled = Passwords(env={"PGPASSFILE": str(passfile)}).fill(bare)
    assert filled == layout.b

    async def connects() -> int:
        conn = await asyncpg.connect(asyncpg_dsn(filled))
        try:
            return int(await conn.fetchval("SELECT 1"))
        finally:
            await conn.close()

    assert asyncio.run(connects()) == 1
    monkeypatch.setenv("PGPASSFILE", str(passfile))
    assert jdbc_source(bare).properties["password"] == PASSWORDS[1]
    assert "password" not in jdbc_source(bare.replace("app@", "nobody@")).properties
    assert Passwords(env={"PGPASSWORD": "from-env"}).fill(bare) == bare.replace("app@", "app:from-env@")


# -- 6: every command follows the layout ----------------------------------------------------------


async def _home_rows(home: str, name: str) -> None:
    """A projection's offset and one dead letter in the home database, as a worker leaves them."""
    conn = await asyncpg.connect(asyncpg_dsn(home))
    try:
        await conn.execute(
            "INSERT INTO projection_timestamp_offset_store VALUES ($1, '0-1023', 3, 'x', 1, now(), now())", name
        )
        await conn.execute(
            "INSERT INTO projection_dead_letter (projection_name, persistence_id, seq_nr, slice, db_timestamp, "
            "error, traceback, attempts, first_failure, last_failure, projection_key) "
            "VALUES ($1, 'Cart|x', 1, 3, now(), 'boom', '', 3, now(), now(), '')",
            name,
        )
    finally:
        await conn.close()


async def _paused(home: str, name: str) -> list[bool]:
    conn = await asyncpg.connect(asyncpg_dsn(home))
    try:
        return [
            bool(r[0])
            for r in await conn.fetch("SELECT paused FROM projection_management WHERE projection_name = $1", name)
        ]
    finally:
        await conn.close()


def test_every_command_finds_the_home_database_of_the_layout(layout: Layout) -> None:
    """JOURNAL_DATABASES (or --databases) alone: the commands read and change the home database
    (the first one), as `projections run` and the library do; no embedded server is started."""
    asyncio.run(_home_rows(layout.a, "p-home"))
    env = layout.env
    by_option = {k: v for k, v in env.items() if k != "JOURNAL_DATABASES"}
    option = ("--databases", f"{layout.a} {layout.b}")

    status = layout.run("projections", "status", "p-home", "--json")
    assert status.returncode == 0, status.stderr
    ranges = json.loads(status.stdout)[0]["ranges"]
    assert [r["slices"] for r in ranges] == ["0-511", "512-1023"]
    status2 = layout.run("projections", "status", "p-home", "--json", *option, env=by_option)
    assert status2.returncode == 0 and json.loads(status2.stdout)[0]["name"] == "p-home", status2.stderr

    assert layout.run("projections", "pause", "p-home").returncode == 0
    assert asyncio.run(_paused(layout.a, "p-home")) == [True]
    assert layout.run("projections", "resume", "p-home", *option, env=by_option).returncode == 0
    assert asyncio.run(_paused(layout.a, "p-home")) == [False]

    letters = layout.run("projections", "dead-letters", "list", "p-home")
    assert letters.returncode == 0 and "1 dead letters of p-home" in letters.stdout, letters.stderr
    for args in (("journal", "manifests"), ("journal", "timestamp-rule", "status"), ("journal", "info")):
        r = layout.run(*args)
        assert r.returncode == 0, (args, r.stderr)
        no_password(r.stdout, r.stderr)
    rule = layout.run("journal", "timestamp-rule", "status").stdout
    assert rule.count("not installed") == 2 and "sjopa" in rule and "sjopb" in rule
    assert not (Path(env["XDG_DATA_HOME"]) / "slice-journal").exists(), "an embedded server was started"


# -- 7: one database down fails its own slices only -----------------------------------------------


def test_one_database_down_fails_its_own_slices_only(
    layout: Layout, servers: tuple[PasswordServer, PasswordServer]
) -> None:
    from journal import JournalUnavailable
    from tests.support.password_server import start, stop

    low, high = pids_in(0, 511, 3), pids_in(512, 1023, 3)
    quick = dict(attempts=2, initial_backoff=0.05, max_backoff=0.1, connect_timeout=2.0)
    settings = JournalSettings.load(env={}, databases=[layout.a, layout.b], **quick)
    env = {**layout.env, "JOURNAL_RETRY_ATTEMPTS": "2", "JOURNAL_CONNECT_TIMEOUT": "2"}
    down = layout.b.split("@")[1]  # host:port/database, as the reports name it

    async def write_both() -> tuple[int, str]:
        async with open_journal(layout.a, settings=settings) as j:
            for p in low:
                await j.persist(p, [{"n": 1}])
            failed = ""
            try:
                await j.persist(high[0], [{"n": 1}])
            except JournalUnavailable as e:
                failed = str(e)
            return len([e async for e in j.current_events_by_persistence_id(low[0])]), failed

    asyncio.run(write_both())  # both up: the map is recorded in each database
    stop(servers[1])
    try:
        events, failed = asyncio.run(write_both())
        assert events == 2  # the other database's slices keep writing and reading
        assert down in failed, failed
        for args in (("journal", "info"), ("journal", "partitions", "show")):
            r = layout.run(*args, env=env, timeout=60)
            no_password(r.stdout, r.stderr)
            assert r.returncode == 3, (args, r.stdout, r.stderr)
            assert "sjopa" in r.stdout and "0-511" in r.stdout, (args, r.stdout)
            assert down in r.stdout and "unavailable" in r.stdout, (args, r.stdout)
            assert down in r.stderr.strip().splitlines()[-1] and "error: unavailable" in r.stderr, (args, r.stderr)
    finally:
        start(servers[1])
    events, failed = asyncio.run(write_both())
    assert (events, failed) == (3, "")


# -- 5: the demo's databases are its own ----------------------------------------------------------


def test_the_demo_over_several_databases_leaves_the_servers_journal_alone(
    servers: tuple[PasswordServer, PasswordServer], tmp_path: Path
) -> None:
    from tests.support.scratch import admin

    a = servers[0]
    with scratch_database(a.dsn(), "sjopd") as journal_db:
        schema_migrations().upgrade(journal_db)

        async def first_demo_events() -> None:  # what the first `journal demo` left in it
            async with open_journal(journal_db, settings=JournalSettings.load(env={})) as j:
                await j.persist("DemoCart|1", [{"n": 1}])

        asyncio.run(first_demo_events())
        env = clean_env(tmp_path)
        name = journal_db.rsplit("/", 1)[1]
        try:
            demo = subprocess.run(
                [sys.executable, "-m", "journal", "demo", "--dsn", journal_db, "--databases", "2", "--duration", "5",
                 "--entities", "40", "--rate", "50", "--writers", "4", "--workers", "1", "--scale-to", "1"],
                env=env, capture_output=True, text=True, timeout=300,
            )  # fmt: skip
            no_password(demo.stdout, demo.stderr)
            assert demo.returncode == 0, demo.stdout + demo.stderr
            assert "VERIFIED" in demo.stdout
            info = subprocess.run(
                [sys.executable, "-m", "journal", "info", "--dsn", journal_db],
                env=env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert info.returncode == 0, info.stderr
            assert "DemoCart             1" in info.stdout

            async def map_rows() -> int:
                conn = await asyncpg.connect(asyncpg_dsn(journal_db))
                try:
                    return int(await conn.fetchval("SELECT count(*) FROM slice_partition"))
                finally:
                    await conn.close()

            assert asyncio.run(map_rows()) == 0  # the demo recorded nothing in the server's journal
        finally:
            for i in range(2):
                asyncio.run(admin(a.dsn(), f'DROP DATABASE IF EXISTS "{name}_d2_p{i}" WITH (FORCE)'))


@pytest.mark.spark
def test_spark_export_reads_a_moved_range_with_the_password_found_for_it(layout: Layout, tmp_path: Path) -> None:
    """`projections spark-export` over the layout after a move: JDBC reads each database,
    the target with the password of the listed DSN of its server (JDBC ignores PGPASSWORD)."""

    pids = pids_in(0, 511, 4) + pids_in(512, 767, 4) + pids_in(768, 1023, 4)
    settings = JournalSettings.load(env={}, databases=[layout.a, layout.b])

    async def write() -> None:
        async with open_journal(layout.a, settings=settings) as j:
            for p in pids:
                await j.persist(p, [{"n": 1}, {"n": 2}])

    asyncio.run(write())
    assert layout.run("journal", "partitions", "move", "--slices", "512-767", "--to", layout.target).returncode == 0
    out = tmp_path / "export"
    r = layout.run(
        "projections", "spark-export", "--entity-type", "Cart", "--out", str(out), "--master", "local[1]",
        "--partitions", "4", timeout=600,
    )  # fmt: skip
    no_password(r.stdout, r.stderr)
    if r.returncode == 2 and "Java" in r.stderr and not os.environ.get("CI"):
        pytest.skip(f"Spark cannot start here: {r.stderr}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"exported {2 * len(pids)} events of Cart" in r.stdout + r.stderr


def test_the_command_lines_mask_a_password_in_every_log_line() -> None:
    """A log line of any library under a command (here a driver's) has a URL's password masked."""
    code = (
        "import logging; from journal.cli.failures import configure_logging; configure_logging('%(message)s'); "
        "logging.getLogger('asyncpg').warning('lost %s', 'postgresql://app:s3cret-a@db:5432/j?password=s3cret-b')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    no_password(r.stderr)
    assert "postgresql://app:***@db:5432/j?password=***" in r.stderr
