"""The transactional producers a publisher (one process) initializes, by transactional id.

librdkafka goes on initializing a producer whose ``init_transactions`` timed out (the brokers
down) in the background, and the epoch it then takes fences any newer producer of the same id:
a producer this process opened for its retry after the outage would be fenced by its own
abandoned one. So a producer of an id whose initialization did not finish is the next producer
of that id: its ``init_transactions`` is called again (it resumes). And each initialization of
an id is counted, so that a fenced producer can tell whether another producer of this process
fenced it (:meth:`Instances.newer_than`) or another process did.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, Producer


class Instances:
    """The publisher's transactional producers whose initialization did not finish, and the
    count of initializations of each transactional id."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = dict(config)
        """The settings of a new producer (a transactional id added)."""
        self._unready: dict[str, Producer] = {}
        self._inits: dict[str, int] = {}

    def producer(self, txn: str) -> Producer:
        """The producer of ``txn``: the one whose initialization did not finish, else a new one."""
        return self._unready.pop(txn, None) or Producer({**self.config, "transactional.id": txn})

    def holds(self, producer: Producer) -> bool:
        """Whether ``producer`` is one to be initialized again (its last initialization did not finish)."""
        return producer in self._unready.values()

    def init(self, producer: Producer, txn: str, timeout: float) -> int:
        """``init_transactions`` of ``producer`` (of ``txn``); its generation: the count of this
        process's initializations of ``txn`` so far. Counted before the call: one that times
        out may still take an epoch."""
        generation = self._inits[txn] = self._inits.get(txn, 0) + 1
        try:
            producer.init_transactions(timeout)
        except KafkaException as e:
            if not e.args[0].fatal():
                self._unready[txn] = producer
            raise
        return generation

    def newer_than(self, txn: str, generation: int) -> bool:
        """Whether this process initialized ``txn`` again after ``generation`` (or is at it)."""
        return self._inits.get(txn, 0) != generation or txn in self._unready
