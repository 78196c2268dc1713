"""Re-export: vector time lives in the model layer (:mod:`journal.vector_time`)."""

from ..vector_time import VectorTime

__all__ = ["VectorTime"]
