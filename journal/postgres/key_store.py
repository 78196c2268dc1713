"""The default key store of encrypted payloads: the ``encryption_key`` table (issue 26)."""

from __future__ import annotations

from collections.abc import Sequence

from ..codec import MasterKey, new_key
from .connections import PostgresConnections, PostgresPart


class PostgresKeyStore(PostgresPart):
    """Data keys by subject in this database, wrapped with ``master`` when one is configured.

    Keys are made in Python (64 random bytes) and inserted with ``ON CONFLICT DO NOTHING``, so two
    writers that make a subject's key at once both end up with the one that was stored."""

    def __init__(self, conns: PostgresConnections, master: MasterKey | None = None) -> None:
        super().__init__(conns)
        self.master = master

    async def data_keys(self, subjects: Sequence[str], *, create: bool) -> dict[str, bytes | None]:
        subjects = list(subjects)
        if create:
            fresh = [new_key() for _ in subjects]
            stored = [self.master.wrap(s, k) if self.master else k for s, k in zip(subjects, fresh, strict=True)]
            await self.conns.execute("make keys", self.sql.insert_keys, subjects, stored)
        rows = await self.conns.fetch("load keys", self.sql.load_keys, subjects)
        out: dict[str, bytes | None] = {}
        for subject, key in rows:
            if key is None:
                out[subject] = None
            else:
                out[subject] = self.master.unwrap(subject, bytes(key)) if self.master else bytes(key)
        return out

    async def forget(self, subject: str) -> bool:
        """Delete the key (the row stays as a tombstone, so it is never made again)."""
        return bool(await self.conns.fetchval("forget subject", self.sql.forget_key, subject))
