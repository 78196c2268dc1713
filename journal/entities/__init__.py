"""Event-sourced entities on the journal (the Eventuate programming model).

See README, "Entities": :class:`Entity`, :class:`EntityRegistry`, routing helpers, the
circuit breaker; writers and processors on the projection runner.
"""

from .circuit_breaker import BreakerState, CircuitBreaker
from .entity import AfterPersist, Entity, EventContext, after_persist
from .processor import Processor
from .registry import EntityRegistry
from .routing import destinations_of, routed_to
from .writer import Writer, WriterHandler

__all__ = [
    "AfterPersist",
    "BreakerState",
    "CircuitBreaker",
    "Entity",
    "EntityRegistry",
    "EventContext",
    "Processor",
    "Writer",
    "WriterHandler",
    "after_persist",
    "destinations_of",
    "routed_to",
]
