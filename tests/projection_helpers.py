"""Helpers of the projection tests: worker subprocesses and waiting on conditions."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

FAST_ENV = {
    "JOURNAL_PROJECTION_LEASE_TTL": "4",
    "JOURNAL_PROJECTION_LEASE_RENEW_INTERVAL": "0.5",
    "JOURNAL_PROJECTION_HEARTBEAT_OFFSET_INTERVAL": "1",
    "JOURNAL_PROJECTION_HANDLER_BACKOFF": "0.05",
}


def spawn_worker(dsn: str, name: str, entity_type: str, handler: str = "projections.demo.cart:project_carts",
                 mode: str = "grouped", extra: list[str] | None = None,
                 env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "projections", "run", name, "--entity-type", entity_type, "--handler", handler,
         "--mode", mode, "--dsn", dsn, "--no-progress", *(extra or [])],
        env={**os.environ, **FAST_ENV, **(env or {})}, stdout=subprocess.DEVNULL,
        stderr=tempfile.TemporaryFile(),  # a pipe nobody reads would fill up and block the worker
    )  # fmt: skip


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
