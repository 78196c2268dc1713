"""Handler kinds and how a ``module:callable`` handler is found.

- ``exactly-once``: ``async def handler(conn, envelope)``, inside the offset transaction;
- ``grouped``: ``async def handler(conn, envelopes)``, a batch in one offset transaction (fast path);
- ``at-least-once``: ``async def handler(envelope)``, offsets stored every N envelopes / T seconds.
"""

from __future__ import annotations

import functools
import inspect
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


_ARGS: dict[str, tuple[str, ...]] = {
    "exactly-once": ("conn", "envelope"),
    "grouped": ("conn", "envelopes"),
    "at-least-once": ("envelope",),
}
"""What each mode passes to the handler, by name (for the messages)."""


def check_handler(handler: Any, mode: str, name: str | None = None) -> Callable[..., Awaitable[None]]:
    """Refuse, before anything runs, a handler the runner could not call: not callable, a plain
    (``def``) function where the runner awaits the result, or one whose parameters do not take
    what ``mode`` passes. A callable object is checked through its ``__call__``."""
    m = validate_mode(mode)
    what = f"handler {name or getattr(handler, '__qualname__', type(handler).__name__)!r}"
    if not callable(handler):
        raise ConfigurationError(f"{what} is not callable (a {type(handler).__name__})")
    plain = handler.func if isinstance(handler, functools.partial) else handler
    call = plain if inspect.isfunction(plain) or inspect.ismethod(plain) else getattr(plain, "__call__", None)  # noqa: B004
    if (inspect.isfunction(call) or inspect.ismethod(call)) and not (
        inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(handler)
    ):
        raise ConfigurationError(
            f"{what} is a plain function: the runner awaits it, so it must be `async def` "
            f"({m} mode calls handler({', '.join(_ARGS[m])}))"
        )
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return handler  # type: ignore[no-any-return]
    try:
        signature.bind(*_ARGS[m])
    except TypeError as e:
        raise ConfigurationError(
            f"{what} takes ({', '.join(signature.parameters)}) but {m} mode calls it as "
            f"handler({', '.join(_ARGS[m])}): {e}"
        ) from None
    return handler  # type: ignore[no-any-return]


def load_handler(spec: str, mode: str = "grouped") -> Callable[..., Awaitable[None]]:
    """Import ``package.module:callable`` (:func:`journal.hooks.load_object`) and check it for
    ``mode`` (:func:`check_handler`): a clear error at start when it is not there, does not
    import, or cannot be called that way."""
    from journal.hooks import load_object

    return check_handler(load_object(spec, "handler"), mode, spec)
