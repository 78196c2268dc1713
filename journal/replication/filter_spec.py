"""Replication filters written in an endpoint's config file (the ``filters`` key), parsed and validated.

A spec is a small tree, so an endpoint process can be given the same filters as code would build
with :mod:`journal.replication.filters`::

    {"tagged": ["t1", "t2"]}          events carrying any of these tags
    {"persistence_ids": ["Order|1"]}  events of these entities
    {"not": SPEC}                     the opposite
    {"all": [SPEC, ...]}              every one passes (and)
    {"any": [SPEC, ...]}              at least one passes (or)

The ``filters`` key holds ``source_logs`` (log name -> SPEC) and ``target_locations`` (location
id -> SPEC), as :class:`~journal.replication.filters.EndpointFilters`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigurationError
from .filters import EndpointFilters, ReplicationFilter, persistence_ids, tagged


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ConfigurationError(f"filter {where}: expected a non-empty list of strings, got {value!r}")
    return value


def _specs(value: Any, where: str) -> list[ReplicationFilter]:
    if not isinstance(value, list) or not value:
        raise ConfigurationError(f"filter {where}: expected a non-empty list of filters, got {value!r}")
    return [parse_filter(v, where) for v in value]


def _all(parts: list[ReplicationFilter]) -> ReplicationFilter:
    combined = parts[0]
    for p in parts[1:]:
        combined = combined & p
    return combined


def _any(parts: list[ReplicationFilter]) -> ReplicationFilter:
    combined = parts[0]
    for p in parts[1:]:
        combined = combined | p
    return combined


_KINDS: dict[str, Callable[[Any, str], ReplicationFilter]] = {
    "tagged": lambda v, w: tagged(*_strings(v, f"{w}.tagged")),
    "persistence_ids": lambda v, w: persistence_ids(*_strings(v, f"{w}.persistence_ids")),
    "not": lambda v, w: ~parse_filter(v, f"{w}.not"),
    "all": lambda v, w: _all(_specs(v, f"{w}.all")),
    "any": lambda v, w: _any(_specs(v, f"{w}.any")),
}


def parse_filter(spec: Any, where: str = "filter") -> ReplicationFilter:
    """One spec (a single-key mapping, see the module docstring) as a :class:`ReplicationFilter`."""
    if not isinstance(spec, Mapping) or len(spec) != 1:
        raise ConfigurationError(f"{where}: a filter is a mapping with one of {sorted(_KINDS)}, got {spec!r}")
    ((kind, value),) = spec.items()
    if kind not in _KINDS:
        raise ConfigurationError(f"{where}: unknown filter {kind!r}, expected one of {sorted(_KINDS)}")
    return _KINDS[kind](value, where)


def parse_endpoint_filters(raw: Any) -> EndpointFilters:
    """The ``filters`` key of an endpoint config: ``source_logs`` and ``target_locations``."""
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"filters: expected a mapping, got {raw!r}")
    unknown = set(raw) - {"source_logs", "target_locations"}
    if unknown:
        raise ConfigurationError(f"filters: unknown keys {sorted(unknown)} (source_logs, target_locations)")
    groups: dict[str, dict[str, ReplicationFilter]] = {}
    for group in ("source_logs", "target_locations"):
        specs = raw.get(group, {})
        if not isinstance(specs, Mapping):
            raise ConfigurationError(f"filters.{group}: expected a mapping of name to filter, got {specs!r}")
        groups[group] = {str(k): parse_filter(v, f"filters.{group}.{k}") for k, v in specs.items()}
    return EndpointFilters(groups["source_logs"], groups["target_locations"])
