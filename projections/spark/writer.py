"""Writing a computed read model back to PostgreSQL: staging table, then one swap transaction.

Spark writes the rows (JDBC, batched) into a fresh staging table; then one asyncpg transaction
replaces (or upserts into) the target table from the staging table, optionally writes more in
the same transaction (the backfill's offsets), and drops the staging table. Until that commit
the target is untouched, so an interrupted or failed run changes nothing a reader can see;
running it twice gives the same result.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg

from journal.errors import InvalidArgument
from journal.postgres import asyncpg_dsn
from journal.settings import validate_identifier

from . import sql
from .jdbc import JdbcSource

WriteMode = Literal["replace", "merge"]
STAGING_PREFIX = "_spark_staging_"

InTransaction = Callable[[asyncpg.Connection], Awaitable[None]]


@dataclass(frozen=True)
class WriteResult:
    table: str
    rows: int
    mode: WriteMode


def _check(table: str, key: Sequence[str], mode: str, columns: Sequence[str]) -> None:
    validate_identifier(table, "table")
    if mode not in ("replace", "merge"):
        raise InvalidArgument(f"mode must be 'replace' or 'merge', got {mode!r}")
    for c in columns:
        validate_identifier(c, "column")
    missing = [k for k in key if k not in columns]
    if missing:
        raise InvalidArgument(f"key columns {missing} are not columns of the read model {list(columns)}")
    if mode == "merge" and not key:
        raise InvalidArgument("mode 'merge' needs key columns")


def staging_name(table: str) -> str:
    return f"{STAGING_PREFIX}{table[:30]}_{uuid.uuid4().hex[:8]}"


def write_staging(df: Any, source: JdbcSource, staging: str, *, batch_size: int = 10_000) -> None:
    """Write ``df`` into the (new) staging table ``staging``, replacing any previous one."""
    df.write.jdbc(
        url=source.url,
        table=source.table(staging),
        mode="overwrite",
        properties=source.with_properties(batchsize=str(batch_size)),
    )


async def swap_from_staging(
    source: JdbcSource,
    table: str,
    staging: str,
    columns: Sequence[str],
    *,
    key: Sequence[str] = (),
    mode: WriteMode = "replace",
    in_transaction: InTransaction | None = None,
) -> int:
    """In one transaction: create the target if missing, replace/merge, run ``in_transaction``,
    drop staging. Returns the staging row count. The staging table is dropped on failure too."""
    conn = await asyncpg.connect(asyncpg_dsn(source.dsn))
    try:
        try:
            async with conn.transaction():
                await conn.execute(sql.create_like(source.schema, table, staging, key))
                rows = int(await conn.fetchval(sql.count_rows(source.schema, staging)))
                stmts = (
                    sql.replace_from_staging(source.schema, table, staging, columns)
                    if mode == "replace"
                    else sql.merge_from_staging(source.schema, table, staging, columns, key)
                )
                for s in stmts:
                    await conn.execute(s)
                if in_transaction is not None:
                    await in_transaction(conn)
                await conn.execute(sql.drop_table(source.schema, staging))
            return rows
        finally:
            await conn.execute(sql.drop_table(source.schema, staging))
    finally:
        await conn.close()


async def write_read_model(
    df: Any,
    source: JdbcSource,
    table: str,
    *,
    key: Sequence[str] = (),
    mode: WriteMode = "replace",
    batch_size: int = 10_000,
    in_transaction: InTransaction | None = None,
) -> WriteResult:
    """Write ``df`` as the content of ``table`` (``replace``) or upsert it by ``key`` (``merge``).

    A missing target is created with the DataFrame's columns and ``key`` as primary key.
    ``in_transaction`` runs inside the swap transaction (e.g. to store offsets atomically).

    Raises:
        InvalidArgument: bad table/column names, unknown key columns, merge without key (no I/O).
    """
    columns = list(df.columns)
    _check(table, key, mode, columns)
    staging = staging_name(table)
    try:
        write_staging(df, source, staging, batch_size=batch_size)
    except BaseException:
        await _drop(source, staging)
        raise
    rows = await swap_from_staging(source, table, staging, columns, key=key, mode=mode, in_transaction=in_transaction)
    return WriteResult(table=table, rows=rows, mode=mode)


async def drop_staging_tables(source: JdbcSource, table: str) -> list[str]:
    """Drop staging tables left for ``table`` by interrupted runs; return their names."""
    conn = await asyncpg.connect(asyncpg_dsn(source.dsn))
    try:
        prefix = f"{STAGING_PREFIX}{table[:30]}_"
        pattern = prefix.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%") + "%"
        names = [r[0] for r in await conn.fetch(sql.STAGING_TABLES, source.schema, pattern)]
        for n in names:
            await conn.execute(sql.drop_table(source.schema, n))
        return names
    finally:
        await conn.close()


async def _drop(source: JdbcSource, table: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(source.dsn))
    try:
        await conn.execute(sql.drop_table(source.schema, table))
    finally:
        await conn.close()
