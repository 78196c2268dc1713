"""The configuration of one replication endpoint, read from a TOML or JSON file and validated.

The file is validated against the dataclasses below by pydantic (their annotations are the
schema), so every mistake is reported with its key and what was expected: ``logs = "Order"`` is
"logs: expected a list" rather than five logs ``O, r, d, e, r``; a missing key is named.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Annotated, Any

import pydantic

from ..errors import ConfigurationError, InvalidArgument
from ..ids import validate_entity_type
from .filter_spec import parse_endpoint_filters
from .filters import EndpointFilters
from .versions import Application

_LOCATION = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_ADDRESS = re.compile(r"^[A-Za-z0-9_.-]+:\d{1,5}$")


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """PEM files: this endpoint's certificate and key, and the CA that signed its peers'."""

    cert: Path
    key: Path
    ca: Path
    server_name: str | None = None
    """Name to check in the peers' certificates instead of the host of their address."""


@dataclass(frozen=True, slots=True)
class Connection:
    """A remote endpoint this one pulls from (and which it wakes up for)."""

    address: str
    logs: tuple[str, ...] | None = None
    """Logs to pull from it; None: every log of this endpoint."""


def _filters(raw: Any) -> Any:
    """The ``filters`` key is a small language of its own (:mod:`.filter_spec`)."""
    return raw if isinstance(raw, EndpointFilters) else parse_endpoint_filters(raw)


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    __pydantic_config__ = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    location: str
    """Globally unique id of this location (letters, digits, ``_.-``)."""
    dsn: str
    """The location's own database; never another location's."""
    listen: str
    """``host:port`` the endpoint serves its logs on."""
    logs: tuple[str, ...]
    """Replicated logs by name; a log is every event of the entity type of that name."""
    connections: tuple[Connection, ...] = ()
    application: Application = field(default_factory=Application)
    tls: TlsConfig | None = None
    batch_size: int = 500
    """Events per replication read."""
    retry_delay: float = 2.0
    """Seconds before the next read after an empty batch (notifications usually come first)."""
    failure_detection_limit: float = 10.0
    """Seconds without a successful read before a remote log is reported unavailable."""
    update_notifications: bool = True
    """Wake connected endpoints on writes (polling every ``retry_delay`` stays as the fallback)."""
    migrate: bool = False
    """Run the journal migrations at start."""
    private_tags: tuple[str, ...] = ()
    """Events carrying one of these tags are location-private: never sent to another endpoint."""
    filters: Annotated[EndpointFilters, pydantic.BeforeValidator(_filters)] = field(default_factory=EndpointFilters)
    """What this endpoint sends, per source log and per target location (``filters`` key, see
    :mod:`journal.replication.filter_spec`); applied at this endpoint when others read from it."""

    def __post_init__(self) -> None:
        if not _LOCATION.match(self.location):
            raise ConfigurationError(f"location id must be 1-64 of letters, digits, '_.-', got {self.location!r}")
        for address in (self.listen, *(c.address for c in self.connections)):
            if not _ADDRESS.match(address):
                raise ConfigurationError(f"address must be host:port, got {address!r}")
        if not self.logs:
            raise ConfigurationError("an endpoint needs at least one log name")
        for name in self.logs:
            try:
                validate_entity_type(name, required=True)
            except InvalidArgument as e:
                raise ConfigurationError(f"log name {name!r}: {e}") from e
        for c in self.connections:
            unknown = set(c.logs or ()) - set(self.logs)
            if unknown:
                raise ConfigurationError(f"connection {c.address}: logs {sorted(unknown)} are not this endpoint's logs")
        unknown_logs = set(self.filters.source_logs) - set(self.logs)
        if unknown_logs:
            raise ConfigurationError(f"filters.source_logs: {sorted(unknown_logs)} are not this endpoint's logs")
        if self.batch_size < 1 or self.retry_delay <= 0 or self.failure_detection_limit <= 0:
            raise ConfigurationError("batch_size must be >= 1, retry_delay and failure_detection_limit > 0")

    def logs_of(self, c: Connection) -> tuple[str, ...]:
        return self.logs if c.logs is None else c.logs

    @classmethod
    def load(cls, path: str | Path) -> EndpointConfig:
        """Read a ``.toml`` or ``.json`` file; relative TLS paths are relative to the file. Every
        error is a ConfigurationError naming the file, the key and what was expected."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
            raw: Any = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
        except (OSError, ValueError) as e:
            raise ConfigurationError(f"cannot read endpoint config {p}: {e}") from e
        return cls.from_dict(raw, base=p.parent, source=f"endpoint config {p}")

    @classmethod
    def from_dict(cls, raw: Any, base: Path = Path(), source: str = "endpoint config") -> EndpointConfig:
        """Validate a mapping (a parsed config file); relative TLS paths are relative to ``base``."""
        if isinstance(raw, dict) and isinstance(raw.get("tls"), dict):
            tls = raw["tls"]
            raw = {**raw, "tls": {k: base / v if k in ("cert", "key", "ca") and isinstance(v, str) else v
                                  for k, v in tls.items()}}  # fmt: skip
        try:
            config: EndpointConfig = _adapter().validate_python(raw)
        except pydantic.ValidationError as e:
            raise ConfigurationError(f"{source}: {'; '.join(map(_explain, e.errors()))}") from None
        return config


@cache
def _adapter() -> pydantic.TypeAdapter[EndpointConfig]:
    return pydantic.TypeAdapter(EndpointConfig)


_EXPECTED = {
    "missing": "missing: this key is required",
    "unexpected_keyword_argument": "unknown key",
    "tuple_type": "expected a list",
    "list_type": "expected a list",
    "dict_type": "expected a table (a mapping)",
    "dataclass_type": "expected a table (a mapping)",
    "string_type": "expected a string",
    "int_parsing": "expected an integer",
    "int_type": "expected an integer",
    "float_parsing": "expected a number",
    "float_type": "expected a number",
    "bool_parsing": "expected true or false",
    "bool_type": "expected true or false",
}


def _explain(error: Any) -> str:
    """One pydantic error as ``key: what was expected (got ...)``."""
    where = ".".join(str(part) for part in error["loc"]) or "(top level)"
    kind = error["type"]
    if kind == "value_error":
        ctx = str(error.get("ctx", {}).get("error"))
        return ctx if where == "(top level)" or ctx.startswith(where) else f"{where}: {ctx}"
    expected = _EXPECTED.get(kind, error["msg"])
    shown = "" if kind in ("missing", "unexpected_keyword_argument") else f" (got {error.get('input')!r:.60})"
    return f"{where}: {expected}{shown}"
