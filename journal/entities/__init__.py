"""Event-sourced entities on the journal (the Eventuate programming model).

See README, "Entities": :class:`Entity`, :class:`EntityRegistry`, routing helpers, the
circuit breaker; writers and processors on the projection runner.
"""

from .circuit_breaker import BreakerState, CircuitBreaker
from .delivery import Destination
from .entity import AfterPersist, Entity, EventContext, after_persist
from .processor import Processor
from .registry import EntityRegistry
from .reliable import Delivery
from .routing import destinations_of, routed_to
from .snapshot_result import SnapshotResult
from .stateful import StatefulProcessor, StatefulWriter
from .writer import Writer, WriterHandler, processed_up_to

__all__ = [
    "AfterPersist",
    "BreakerState",
    "CircuitBreaker",
    "Delivery",
    "Destination",
    "Entity",
    "EntityRegistry",
    "EventContext",
    "Processor",
    "SnapshotResult",
    "StatefulProcessor",
    "StatefulWriter",
    "Writer",
    "WriterHandler",
    "after_persist",
    "destinations_of",
    "processed_up_to",
    "routed_to",
]
