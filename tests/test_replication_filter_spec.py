"""Replication filters from an endpoint config file: the spec grammar and its validation."""

from __future__ import annotations

from typing import Any

import pytest

from journal.errors import ConfigurationError
from journal.replicated import ReplicatedEvent
from journal.replication.config import EndpointConfig
from journal.replication.filter_spec import parse_endpoint_filters, parse_filter
from journal.serialization import Serialized
from journal.vector_time import VectorTime

BASE = {"location": "A", "dsn": "postgresql://x/y", "listen": "127.0.0.1:1", "logs": ["Order"]}


def event(pid: str, *tags: str) -> ReplicatedEvent:
    return ReplicatedEvent(pid, Serialized(1, "", b"{}"), "A", 1, VectorTime({"A": 1}), 1, tuple(tags))


def test_specs_compose_with_and_or_not() -> None:
    f = parse_filter({"any": [{"not": {"tagged": ["draft"]}}, {"persistence_ids": ["Order|keep"]}]})
    assert f(event("Order|1")) and f(event("Order|1", "other"))
    assert not f(event("Order|1", "draft"))
    assert f(event("Order|keep", "draft"))
    g = parse_filter({"all": [{"tagged": ["a", "b"]}, {"not": {"tagged": ["c"]}}]})
    assert g(event("p", "b")) and not g(event("p", "b", "c")) and not g(event("p"))


def test_config_file_filters_become_endpoint_filters() -> None:
    cfg = EndpointConfig.from_dict(
        {
            **BASE,
            "filters": {
                "source_logs": {"Order": {"tagged": ["t"]}},
                "target_locations": {"C": {"not": {"tagged": ["t"]}}},
            },
        }
    )
    read_c = cfg.filters.for_read("Order", "C")
    read_b = cfg.filters.for_read("Order", "B")
    assert read_c is not None and read_b is not None
    assert read_b(event("p", "t")) and not read_c(event("p", "t"))
    assert EndpointConfig.from_dict(BASE).filters.for_read("Order", "C") is None


@pytest.mark.parametrize(
    "spec",
    [
        {"tagged": []},
        {"tagged": "t"},
        {"tagged": ["t"], "not": {"tagged": ["u"]}},
        {"surprise": ["t"]},
        {"all": []},
        {"any": {"tagged": ["t"]}},
        {"not": ["t"]},
        "tagged",
    ],
)
def test_bad_specs_are_refused(spec: Any) -> None:
    with pytest.raises(ConfigurationError):
        parse_filter(spec)


@pytest.mark.parametrize(
    "filters",
    [
        {"sources": {}},
        {"source_logs": {"Other": {"tagged": ["t"]}}},
        {"target_locations": [{"tagged": ["t"]}]},
        {"target_locations": {"C": {"tagged": []}}},
        [],
    ],
)
def test_bad_filters_in_a_config_are_refused(filters: Any) -> None:
    with pytest.raises(ConfigurationError):
        EndpointConfig.from_dict({**BASE, "filters": filters})


def test_filters_in_config_and_in_code_are_refused() -> None:
    from journal.replication.endpoint import ReplicationEndpoint

    cfg = EndpointConfig.from_dict({**BASE, "filters": {"target_locations": {"C": {"tagged": ["t"]}}}})
    with pytest.raises(ConfigurationError, match="one place"):
        ReplicationEndpoint(cfg, filters=parse_endpoint_filters({"source_logs": {"Order": {"tagged": ["u"]}}}))
