"""How many projection transactions may hold a connection of one pool at once.

A projection's handler runs inside its batch's transaction, on a pooled connection, and it may
read the journal there (the entities' writers read each target's highest sequence number): that
read takes a second connection of the same pool when the worker runs on the journal's pool (one
pool per process). If every connection of the pool were held by such a transaction, each would
wait for its second connection forever. Its worker's lease round may hold one more while it
waits for the transaction's lease locks (renewing a lease waits for the ``FOR SHARE`` of the
offset transaction). So fewer than half the pool is admitted into transactions: those and one
lease round per transaction leave at least one connection for the handlers' reads, which hold
it for one statement and never wait for another meanwhile, so they finish, a transaction
commits, and its lease round goes on: a wait, never a hang.
"""

from __future__ import annotations

import asyncio
from types import TracebackType


class TransactionSlots:
    """``async with slots:`` around taking a connection for a transaction; at most ``limit``
    are inside at once, the others wait their turn (first come, first served)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free = asyncio.Semaphore(max(limit, 1))

    @classmethod
    def of_shared_pool(cls, pool_size: int) -> TransactionSlots:
        """Fewer than half of a pool that handlers also read from (0 below 3: too small to share)."""
        return cls((pool_size - 1) // 2)

    async def __aenter__(self) -> None:
        await self._free.acquire()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._free.release()
