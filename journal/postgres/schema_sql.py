"""The base of every class of statements for one schema: the schema's name checked once, and its
tables named one way (``"schema".table``). Identifiers come from validated configuration and are
quoted here; values are always parameters."""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import validate_identifier


@dataclass(frozen=True)
class SchemaSql:
    schema: str

    def __post_init__(self) -> None:
        validate_identifier(self.schema, "schema")

    def t(self, table: str) -> str:
        """``table`` of this schema, as the statements name it."""
        return f'"{self.schema}".{table}'

    def delete_pid(self, table: str) -> str:
        """Delete every row of the persistence id ``$1`` from ``table``."""
        return f"DELETE FROM {self.t(table)} WHERE persistence_id = $1"
