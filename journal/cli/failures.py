"""The one place where a command's failure becomes what a person reads: one line on stderr and a
documented exit code (the traceback only with ``--debug``). Both command lines (``journal`` and
``projections``) are built with :class:`HandledGroup`, so every command of them (and a test's
``CliRunner``) goes through :func:`report`; :func:`run_app` runs one as a console script.

Exit codes:

- 0: done;
- 1: the command ran and failed (a projection stopped, the demo found a loss, any other error);
- 2: usage or configuration: a bad option or setting, a wrong password, a missing database or
  table, a file that cannot be read, a port in use. Retrying the same command will not help;
- 3: unavailable: the database (or node, or endpoint) did not answer within the retry budget.
  The same command may work later;
- 130: interrupted (Ctrl-C).
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

import typer
from typer.core import TyperGroup

from ..errors import ConfigurationError, InvalidArgument, JournalError, JournalUnavailable, mask_passwords

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_INTERRUPTED = 130

_debug = False
_quieted: list[str] = []
"""Environment variables this module set to quiet a library (``--debug`` takes them back)."""


def set_debug(on: bool) -> None:
    """``--debug``: tracebacks on failure and DEBUG logging of this library."""
    global _debug
    _debug = on
    if on:
        for name in ("journal", "projections", *QUIET_LOGGERS):
            logging.getLogger(name).setLevel(logging.DEBUG)
        for variable in _quieted:
            os.environ.pop(variable, None)


DebugOption = typer.Option(
    False, "--debug", "-v", help="On failure print the traceback too; log this library's debug messages."
)


def exit_code(exc: BaseException) -> int:
    """The documented exit code of a failure (see the module docstring)."""
    if isinstance(exc, JournalUnavailable):
        return EXIT_UNAVAILABLE
    if isinstance(exc, ConfigurationError | InvalidArgument):
        return EXIT_USAGE
    return EXIT_FAILED


def message(exc: BaseException) -> str:
    """One line naming the cause; an error that is not the library's is named by its type."""
    text = " ".join(str(exc).split()) if isinstance(exc, JournalError) else f"{type(exc).__name__}: {exc}"
    if not isinstance(exc, JournalError):
        text += " (an unexpected error: run again with --debug for the traceback)"
    return mask_passwords(text)


def report(exc: BaseException) -> int:
    """Print ``error: ...`` (and the traceback with --debug); the failure's exit code."""
    if _debug:
        traceback.print_exception(exc, file=sys.stderr)
    typer.secho(f"error: {message(exc)}", err=True, fg=typer.colors.RED)
    return exit_code(exc)


class HandledGroup(TyperGroup):
    """A command group whose commands' failures go through :func:`report` (click's own usage
    errors and exits pass as they are)."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as e:
            if type(e).__module__.startswith(_FRAMEWORK):  # typer.Exit, usage errors: not failures
                raise
            raise typer.Exit(report(e)) from e


_FRAMEWORK = ("typer", "click")
"""Where the command-line framework's own exceptions come from (typer ships its own click)."""


QUIET_LOGGERS = ("cassandra",)
"""Drivers that log each failed connection with a traceback: the command's own error line says
it once (``--debug`` shows them again). gRPC's C core logs to stderr by itself: it is quieted
through ``GRPC_VERBOSITY`` (unless set), before it is imported."""


def configure_logging(fmt: str) -> None:
    """WARNING for everything (the libraries underneath stay quiet); a command raises its own
    loggers when it has something to say."""
    logging.basicConfig(level=logging.WARNING, format=fmt)
    for handler in logging.getLogger().handlers:
        handler.addFilter(_MaskPasswords())
    if "GRPC_VERBOSITY" not in os.environ:
        os.environ["GRPC_VERBOSITY"] = "NONE"
        _quieted.append("GRPC_VERBOSITY")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


class _MaskPasswords(logging.Filter):
    """Every log line a command prints has a URL's password masked (a driver's message, a
    library's, ours): no password is ever printed."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        masked = mask_passwords(text)
        if masked != text:
            record.msg, record.args = masked, None
        return True


def run_app(app: Callable[..., object], prog: str) -> None:
    """Run a Typer app as the console script ``prog``. Click handles usage errors itself (exit
    2); every other failure goes through :func:`fail`."""
    try:
        app(prog_name=prog)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)
    except Exception as e:  # outside a command (loading the app)
        sys.exit(report(e))
