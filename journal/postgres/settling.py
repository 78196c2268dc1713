"""Settling an interrupted statement: the one loop for a write and a projection's transaction.

A client that lost its connection after sending a statement (a write, a COMMIT) cannot tell
whether the server is still executing it; reading the rows before that ends could see "not
written" for a write that commits a moment later. Once the server process is idle or gone its
transaction is final. If it is still busy after ``patience`` seconds it is terminated, which
rolls the statement back (a COMMIT still in its deferred work too); only a process of the
caller's own pool is ever terminated, found by pid *and* ``application_name``. Its row leaves
pg_stat_activity only after the abort.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("journal.postgres.settling")

BUSY = "SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND application_name = $2 AND state = 'active'"
"""Is this server process of ours still executing a statement?"""

TERMINATE = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND application_name = $2"


async def settle(
    conn: Any, server_pid: int, application_name: str, *, patience: float = 10.0, poll: float = 0.01, who: str = ""
) -> None:
    """Wait on ``conn`` (outside a transaction: pg_stat_activity is read once per transaction)
    until ``server_pid`` of the pool named ``application_name`` is no longer running a
    statement; terminate it when it is still busy after ``patience`` seconds (``who`` says
    whose, in the warning)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    while await conn.fetchval(BUSY, server_pid, application_name):
        if loop.time() > deadline:
            log.warning("%sserver process %d still running an interrupted statement; ending it", who, server_pid)
            await conn.fetchval(TERMINATE, server_pid, application_name)
            deadline = loop.time() + patience
        await asyncio.sleep(poll)
