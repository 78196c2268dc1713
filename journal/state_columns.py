"""Additional columns of durable states (docs/durable-state.md, "Additional columns"): values taken
from each change of an entity type and written in the upsert's transaction, in columns you added
to ``durable_state`` or in a table of your own keyed by ``persistence_id`` (Akka Persistence
R2DBC's ``AdditionalColumn``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from .backend import StateColumn
from .errors import ConfigurationError, InvalidArgument
from .ids import validate_entity_type
from .settings import validate_identifier

SKIP: Any = object()
"""What ``bind`` returns to leave the column as it is for that change (R2DBC's ``Skip``)."""

PLUGIN_COLUMNS = frozenset(
    {"slice", "entity_type", "persistence_id", "revision", "db_timestamp", "write_timestamp", "state_ser_id",
     "state_ser_manifest", "state_payload", "tags"}
)  # fmt: skip
"""The plugin's own columns of ``durable_state``: not additional ones."""


class AdditionalColumn(NamedTuple):
    """``column`` of ``table`` (None: ``durable_state`` itself) gets ``bind(change)`` for every
    change of ``entity_type`` written (an ``UpdatedState`` or a ``DeletedState``); ``bind``
    returns :data:`SKIP` to leave it unchanged. A table of your own needs ``persistence_id`` as
    its primary key (its row is inserted on the pid's first change, updated after)."""

    entity_type: str
    column: str
    bind: Callable[[Any], Any]
    """``bind(change)``: a :class:`~journal.UpdatedState` or :class:`~journal.DeletedState`."""
    table: str | None = None


class StateColumns:
    """The additional columns registered, by entity type."""

    def __init__(self) -> None:
        self._by_type: dict[str, list[AdditionalColumn]] = {}

    def checked(self, columns: Iterable[AdditionalColumn], partitioned: bool) -> list[AdditionalColumn]:
        """The columns, their names checked (ConfigurationError naming the column); the database
        check is the backend's."""
        out = []
        for c in columns:
            if type(c) is not AdditionalColumn:
                raise ConfigurationError(f"an additional column must be an AdditionalColumn, got {c!r}")
            try:
                validate_entity_type(c.entity_type, required=True)
            except InvalidArgument as e:
                raise ConfigurationError(f"additional column {c.column!r}: {e}") from e
            validate_identifier(c.column, "additional column")
            if c.table is None and c.column in PLUGIN_COLUMNS:
                raise ConfigurationError(f"additional column {c.column!r} is a column of the plugin's durable_state")
            if c.table is not None:
                validate_identifier(c.table, "additional column table")
                if c.table == "durable_state":
                    raise ConfigurationError("give table=None for a column of durable_state itself")
                if partitioned:
                    raise ConfigurationError(
                        f"additional column {c.table}.{c.column}: a table of its own is not supported on a "
                        "partitioned journal (its rows would not follow `journal partitions move`); add the "
                        "column to durable_state instead"
                    )
            if not callable(c.bind):
                raise ConfigurationError(f"additional column {c.column!r}: bind must be callable")
            out.append(c)
        return out

    def add(self, columns: Sequence[AdditionalColumn]) -> None:
        for c in columns:
            self._by_type.setdefault(c.entity_type, []).append(c)

    def __contains__(self, entity_type: str) -> bool:
        return entity_type in self._by_type

    def values(self, change: Any) -> list[tuple[StateColumn, Any]]:
        """The columns of the change's entity type and their values (skipped ones left out)."""
        out = []
        entity_type: str = change.entity_type
        for c in self._by_type.get(entity_type, ()):
            value = c.bind(change)
            if value is not SKIP:
                out.append((StateColumn(c.table, c.column), value))
        return out
