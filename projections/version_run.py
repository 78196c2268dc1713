"""A versioned projection's worker side (``projections run NAME --version N``): its version
registered at start-up, its handler transactions in the version's schema, and whether it is
still current (a retired version's workers stop). See :mod:`projections.versions`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from journal.errors import InvalidArgument

from .version_store import VersionSql
from .versions import register, tables_schema, validate_version, versioned_name

log = logging.getLogger("projections.versions")

CURRENT = ("building", "serving")
"""The states in which a version's workers go on."""


@dataclass(frozen=True)
class ProjectionVersioning:
    """Version ``version`` of projection ``name``, as its workers run it."""

    name: str
    version: int
    tables_schema: str
    sql: VersionSql

    @property
    def versioned_name(self) -> str:
        return versioned_name(self.name, self.version)

    @staticmethod
    def of(journal_schema: str, name: str, version: int | None, mode: str) -> ProjectionVersioning | None:
        """None for an unversioned projection; checked before anything connects."""
        if version is None:
            return None
        validate_version(version)
        if mode == "at-least-once":
            raise InvalidArgument(
                "a versioned projection writes its tables in the handler's transaction: "
                "--mode exactly-once or grouped, not at-least-once"
            )
        return ProjectionVersioning(
            name, version, tables_schema(journal_schema, name, version), VersionSql(journal_schema)
        )

    async def register(self, pool: Any, entity_type: str) -> None:
        async with pool.acquire() as conn:
            await register(conn, self.sql, self.name, self.version, entity_type)

    async def current(self, pool: Any) -> bool:
        """Is the version still building or serving? Logs why not."""
        async with pool.acquire() as conn:
            state = await self.sql.state(conn, self.name, self.version)
        if state in CURRENT:
            return True
        log.info(
            "version %d of %s is %s: its workers stop", self.version, self.name,
            "dropped" if state is None else f"{state} (another version serves)",
        )  # fmt: skip
        return False

    async def use_schema(self, conn: Any) -> None:
        """In a handler's transaction: unqualified table names are the version's."""
        await self.sql.use_schema(conn, self.tables_schema)
