"""Event-sourced entities on the journal (the Eventuate programming model).

See README, "Entities": :class:`Entity`, :class:`EntityRegistry`, routing helpers, the
circuit breaker; writers and processors in :mod:`journal.entities.writers`.
"""

from .circuit_breaker import BreakerState, CircuitBreaker
from .entity import AfterPersist, Entity, after_persist
from .processor import Processor
from .registry import EntityRegistry
from .routing import destinations_of, routed_to

__all__ = [
    "AfterPersist",
    "BreakerState",
    "CircuitBreaker",
    "Entity",
    "EntityRegistry",
    "Processor",
    "after_persist",
    "destinations_of",
    "routed_to",
]
