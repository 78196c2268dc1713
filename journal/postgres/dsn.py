"""DSN handling: one place that turns a DSN into what each driver wants."""

from __future__ import annotations

from urllib.parse import urlsplit

from ..errors import ConfigurationError, mask_passwords


def validate_dsn(dsn: str) -> str:
    """Accept ``postgresql://`` / ``postgres://`` URLs (asyncpg and libpq style)."""
    if not isinstance(dsn, str) or not dsn.strip():
        raise ConfigurationError("DSN must be a non-empty string")
    scheme = urlsplit(dsn).scheme
    if scheme.split("+")[0] not in ("postgresql", "postgres"):
        raise ConfigurationError(f"not a PostgreSQL DSN (scheme {scheme!r}): expected postgresql://...")
    return dsn


def asyncpg_dsn(dsn: str) -> str:
    """asyncpg wants plain ``postgresql://`` (no ``+driver`` suffix)."""
    validate_dsn(dsn)
    _, _, rest = dsn.partition("://")
    return "postgresql://" + rest


def sqlalchemy_url(dsn: str) -> str:
    """SQLAlchemy with psycopg 3: ``postgresql+psycopg://``."""
    validate_dsn(dsn)
    _, _, rest = dsn.partition("://")
    return "postgresql+psycopg://" + rest


def without_password(dsn: str) -> str:
    """The DSN with no password at all: how the partition map names a database (a map row is
    readable by whoever reads the table; the password comes from configuration or libpq's
    environment and password file)."""
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    netloc = parts.netloc.replace(f":{parts.password}@", "@")
    return parts._replace(netloc=netloc).geturl()


def redact(dsn: str) -> str:
    """The DSN with its password masked (``***``), for logs and CLI output."""
    return mask_passwords(dsn)


def target_of(dsn: str) -> str:
    """``host:port/database`` of a DSN (no user, no password), the way error messages name a
    server; a Unix socket directory stands where the host would."""
    parts = urlsplit(dsn)
    query = dict(p.partition("=")[::2] for p in parts.query.split("&") if p)
    host = parts.hostname or query.get("host") or "localhost"
    try:
        port = parts.port or int(query.get("port") or 5432)
    except ValueError:
        port = 5432
    database = parts.path.lstrip("/") or query.get("dbname") or parts.username or ""
    return f"{host}:{port}/{database}"
