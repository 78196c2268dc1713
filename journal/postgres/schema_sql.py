"""The base of every class of statements for one schema: the schema's name checked once, and its
tables named one way (``"schema".table``). Identifiers come from validated configuration and are
quoted here; values are always parameters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, overload

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


class _Names(dict[str, str]):
    """``{table}`` in a statement's text: the table as its class names it (``t``); ``{schema}``: the
    schema's own name."""

    def __init__(self, statements: SchemaSql, values: dict[str, str]) -> None:
        super().__init__(values, schema=statements.schema)
        self._statements = statements

    def __missing__(self, table: str) -> str:
        return self._statements.t(table)


class Sql:
    """A statement of a :class:`SchemaSql` class, written as its text with the tables it names in
    braces (``"SELECT ... FROM {event_journal} WHERE ..."``): read on an instance, it is that text
    for the instance's schema. The text stays one literal a reader can search for, without a
    method around each one. ``values``: other names the text uses (a list of columns)."""

    def __init__(self, text: str, **values: str) -> None:
        self.text, self.values = text, values

    @overload
    def __get__(self, statements: None, owner: type[Any]) -> Sql: ...
    @overload
    def __get__(self, statements: SchemaSql, owner: type[Any]) -> str: ...
    def __get__(self, statements: SchemaSql | None, owner: type[Any]) -> Sql | str:
        if statements is None:
            return self
        return self.text.format_map(_Names(statements, self.values))
