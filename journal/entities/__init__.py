"""Event-sourced entities on the journal (the Eventuate programming model).

See README, "Entities": :class:`Entity`, :class:`EntityRegistry`, routing helpers, the
circuit breaker; writers and processors on the projection runner; the :class:`EventRouter` that
delivers routed events; :class:`View`; conditional requests (``ask(..., after=vector_time)``);
confirmed delivery (:class:`Delivery`), snapshot results, stateful writers and processors.
"""

from .circuit_breaker import BreakerState, CircuitBreaker
from .conditional import TimedReply
from .confirmed_delivery import Destination
from .delivery import RoutedEvent
from .delivery_scan import DeliveryScan
from .entity import AfterPersist, Entity, EventContext, after_persist
from .processor import Processor
from .registry import EntityRegistry
from .reliable import Delivery
from .router import EventRouter
from .routing import destinations_of, routed_from, routed_to
from .snapshot_result import SnapshotResult
from .stateful import StatefulProcessor, StatefulWriter
from .view import View
from .writer import Writer, WriterHandler

__all__ = [
    "AfterPersist",
    "BreakerState",
    "CircuitBreaker",
    "Delivery",
    "DeliveryScan",
    "Destination",
    "Entity",
    "EntityRegistry",
    "EventContext",
    "EventRouter",
    "Processor",
    "RoutedEvent",
    "SnapshotResult",
    "StatefulProcessor",
    "StatefulWriter",
    "TimedReply",
    "View",
    "Writer",
    "WriterHandler",
    "after_persist",
    "destinations_of",
    "routed_from",
    "routed_to",
]
