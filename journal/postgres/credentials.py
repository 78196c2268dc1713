"""Where the password of a DSN that has none comes from (docs/scaling-out.md, "Credentials").

The journal never stores a password: the partition map names a database by its DSN without one
(a move's target, a database found through another's rows). A process finds the password, for
asyncpg and for Spark's JDBC reads alike, in this order:

1. the DSN's own password;
2. a DSN this process was given (``partitions.databases``, the home ``dsn``, a move's ``--to``)
   for the same server and role: same host, port and user (a role's password is the server's,
   whatever the database);
3. libpq's password file: ``PGPASSFILE``, else ``~/.pgpass`` (lines
   ``host:port:database:user:password``, ``*`` for any, as libpq reads them);
4. ``PGPASSWORD``.

Nothing found: the DSN stays as it is (a server that trusts the client needs none).
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

Server = tuple[str, int, str, str]
"""``(host, port, database, user)`` of a DSN, as libpq matches a password file's lines."""


def server_of(dsn: str, env: Mapping[str, str]) -> Server:
    """Host (a Unix socket's directory stands where the host would), port, database and user."""
    parts = urlsplit(dsn)
    query = dict(p.partition("=")[::2] for p in parts.query.split("&") if p)
    host = parts.hostname or query.get("host") or env.get("PGHOST") or "localhost"
    try:
        port = parts.port or int(query.get("port") or env.get("PGPORT") or 5432)
    except ValueError:
        port = 5432
    user = unquote(parts.username or "") or query.get("user") or env.get("PGUSER") or _login()
    database = unquote(parts.path.lstrip("/")) or query.get("dbname") or env.get("PGDATABASE") or user
    return host, port, database, user


def _login() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no such user in the passwd database (a container's uid)
        return ""


def password_of(dsn: str) -> str | None:
    parts = urlsplit(dsn)
    if parts.password is not None:
        return unquote(parts.password)
    query = dict(p.partition("=")[::2] for p in parts.query.split("&") if p)
    return unquote(query["password"]) if "password" in query else None


def with_password(dsn: str, password: str) -> str:
    """``dsn`` with ``password`` (percent-encoded) in its user part; a DSN with no user gets
    the user the password was found for."""
    parts = urlsplit(dsn)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return parts._replace(netloc=f"{user}:{quote(password, safe='')}@{hostport}").geturl()


class Passwords:
    """The passwords this process knows of: the DSNs it was given, the password file, the
    environment. :meth:`fill` gives a DSN without one the first that matches."""

    def __init__(self, given: Iterable[str | None] = (), env: Mapping[str, str] | None = None) -> None:
        self.env = os.environ if env is None else env
        self._given: dict[tuple[str, int, str], str] = {}
        for d in given:
            if d:
                self.learn(d)

    def learn(self, dsn: str) -> None:
        """Remember the password of ``dsn`` (if it has one) for its server and role."""
        password = password_of(dsn)
        if password is not None:
            host, port, _, user = server_of(dsn, self.env)
            self._given.setdefault((host, port, user), password)

    def fill(self, dsn: str) -> str:
        """``dsn`` with a password: its own, else the first found (see the module docstring)."""
        if password_of(dsn) is not None:
            return dsn
        found = self.find(server_of(dsn, self.env))
        if found is None or not urlsplit(dsn).username:
            return dsn  # a DSN without a user: libpq's default user, and asyncpg finds it alike
        return with_password(dsn, found)

    def find(self, server: Server) -> str | None:
        host, port, _, user = server
        given = self._given.get((host, port, user))
        if given is not None:
            return given
        from_file = _from_passfile(self._passfile(), server)
        if from_file is not None:
            return from_file
        return self.env.get("PGPASSWORD") or None

    def _passfile(self) -> Path | None:
        named = self.env.get("PGPASSFILE")
        if named:
            return Path(named)
        home = self.env.get("HOME")
        return Path(home) / ".pgpass" if home else None


def _from_passfile(path: Path | None, server: Server) -> str | None:
    """The password of the first line of libpq's password file that matches ``server``."""
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:  # no file, or not readable: as libpq, no password from it
        return None
    host, port, database, user = server
    if host.startswith("/"):
        host = "localhost"  # libpq matches a Unix socket's line by "localhost"
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = _split_passfile_line(line)
        if len(fields) != 5:
            continue
        wanted = (host, str(port), database, user)
        if all(f == "*" or f == w for f, w in zip(fields[:4], wanted, strict=True)):
            return fields[4]
    return None


def _split_passfile_line(line: str) -> list[str]:
    """Fields separated by ``:``; ``\\:`` and ``\\\\`` stand for ``:`` and ``\\``."""
    fields: list[str] = []
    current: list[str] = []
    escaped = False
    for ch in line:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ":" and len(fields) < 4:
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
    fields.append("".join(current))
    return fields
