"""Handler kinds and how a ``module:callable`` handler is found.

- ``exactly-once``: ``async def handler(conn, envelope)``, inside the offset transaction;
- ``grouped``: ``async def handler(conn, envelopes)``, a batch in one offset transaction (fast path);
- ``at-least-once``: ``async def handler(envelope)``, offsets stored every N envelopes / T seconds.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, get_args

from journal.envelope import EventEnvelope
from journal.errors import ConfigurationError

Mode = Literal["exactly-once", "grouped", "at-least-once"]
MODES: tuple[str, ...] = get_args(Mode)

ExactlyOnceHandler = Callable[[Any, EventEnvelope], Awaitable[None]]
GroupedHandler = Callable[[Any, Sequence[EventEnvelope]], Awaitable[None]]
AtLeastOnceHandler = Callable[[EventEnvelope], Awaitable[None]]
Handler = ExactlyOnceHandler | GroupedHandler | AtLeastOnceHandler


def validate_mode(mode: str) -> Mode:
    if mode not in MODES:
        raise ConfigurationError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    return mode  # type: ignore[return-value]


def load_handler(spec: str) -> Callable[..., Awaitable[None]]:
    """Import ``package.module:callable`` (clear error when it is not there or not callable)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"handler must look like 'package.module:callable', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigurationError(f"cannot import handler module {module_name!r}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ConfigurationError(f"{module_name!r} has no attribute {attr!r}")
    if not callable(obj):
        raise ConfigurationError(f"handler {spec!r} is not callable")
    return obj  # type: ignore[no-any-return]
