"""Your code the journal calls, found by import path (``package.module:attribute``).

The library takes its hooks as objects (``open_journal(serializers=..., subject_of=...)``); the
command lines, the Spark workers and every process started by configuration name them in the
``hooks`` settings instead (``--subject-of``, ``--upcasters``, ``--serializers`` or
``JOURNAL_SUBJECT_OF``, ``JOURNAL_UPCASTERS``, ``JOURNAL_SERIALIZERS``). One loader, so each
hook is imported and checked the same way wherever it is named, with a one-line
:class:`ConfigurationError` naming the hook and the cause (module not found, attribute
missing, wrong type) before anything connects. Handlers and Spark jobs load through
:func:`load_object` too.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

from .errors import ConfigurationError
from .serialization import SerializerRegistry
from .settings import HookSettings
from .upcasting import Upcasters


def load_object(spec: str, what: str) -> Any:
    """The object ``spec`` (``package.module:attribute``, the attribute possibly dotted) names.

    Raises:
        ConfigurationError: malformed spec, module not found or failing to import, attribute
            missing; the message starts with ``what`` and the spec.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"{what} must look like 'package.module:attribute', got {spec!r}")
    where = f"{what} {spec!r}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise ConfigurationError(f"{where}: module {module_name!r} not found (no module named {e.name!r})") from e
        raise ConfigurationError(f"{where}: importing {module_name!r} failed: {e}") from e
    except SyntaxError as e:
        raise ConfigurationError(f"{where}: {e.msg} ({e.filename}, line {e.lineno})") from e
    except Exception as e:  # the module raised while it was imported
        raise ConfigurationError(f"{where}: importing {module_name!r} failed: {type(e).__name__}: {e}") from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigurationError(f"{where}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def load_subject_of(spec: str) -> Callable[[str], str]:
    """A function ``persistence id -> subject`` (whose key encrypts the pid's payloads)."""
    fn = load_object(spec, "subject_of")
    _takes_one(fn, f"subject_of {spec!r}", "a function (persistence id) -> subject")
    return fn  # type: ignore[no-any-return]


def load_serializers(spec: str) -> SerializerRegistry:
    """A :class:`SerializerRegistry`, or a function of no arguments that returns one."""
    registry: SerializerRegistry = _instance(spec, "serializers", SerializerRegistry)
    return registry


def load_upcasters(spec: str) -> Upcasters:
    """An :class:`Upcasters`, or a function of no arguments that returns one."""
    upcasters: Upcasters = _instance(spec, "upcasters", Upcasters)
    return upcasters


def _instance(spec: str, what: str, cls: type[Any]) -> Any:
    obj = load_object(spec, what)
    if not isinstance(obj, cls) and callable(obj):
        try:
            obj = obj()
        except Exception as e:
            raise ConfigurationError(f"{what} {spec!r}: calling it failed: {type(e).__name__}: {e}") from e
    if not isinstance(obj, cls):
        raise ConfigurationError(
            f"{what} {spec!r} is a {type(obj).__name__}, not a {cls.__name__} (or a function returning one)"
        )
    return obj


def _takes_one(fn: Any, where: str, expected: str) -> None:
    if not callable(fn):
        raise ConfigurationError(f"{where} is a {type(fn).__name__}, not {expected}")
    try:
        inspect.signature(fn).bind("pid")
    except TypeError as e:
        raise ConfigurationError(f"{where} cannot be called with one argument ({e}): it must be {expected}") from None
    except ValueError:  # a builtin without a signature: nothing to check
        pass


class Hooks(NamedTuple):
    """The hooks a journal opens with: what :func:`resolve` made of arguments and settings."""

    serializers: SerializerRegistry | None = None
    subject_of: Callable[[str], str] | None = None


def resolve(
    settings: HookSettings,
    serializers: SerializerRegistry | None = None,
    subject_of: Callable[[str], str] | None = None,
) -> Hooks:
    """The hooks of a journal: an object given wins over its setting; ``settings.upcasters`` are
    added to the registry of ``settings.serializers`` (or to a new one) when no registry is given."""
    if subject_of is None and settings.subject_of:
        subject_of = load_subject_of(settings.subject_of)
    if serializers is None and (settings.serializers or settings.upcasters):
        serializers = load_serializers(settings.serializers) if settings.serializers else SerializerRegistry()
        if settings.upcasters:
            serializers.upcasters.include(load_upcasters(settings.upcasters))
    return Hooks(serializers, subject_of)
