"""A file of librdkafka client settings (``projections run --kafka-config FILE``): one
``key=value`` a line, ``#`` comments and blank lines ignored, the form of Kafka's own
``client.properties``. It is where a login's credentials go (``security.protocol``,
``sasl.mechanisms``, ``sasl.username``, ``sasl.password``), out of the command line and the
process list; no value of it is ever printed."""

from __future__ import annotations

from pathlib import Path

from journal.errors import ConfigurationError


def read_settings(path: Path) -> dict[str, str]:
    """The settings of ``path`` (:class:`ConfigurationError` naming the file, and the line, if it
    cannot be read or a line is not ``key=value``)."""
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigurationError(f"cannot read the Kafka settings file {str(path)!r}: {e}") from None
    settings: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"{path}: line {number} is not key=value")
        settings[key.strip()] = value.strip()
    return settings
