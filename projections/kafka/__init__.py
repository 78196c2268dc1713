"""Events out to Kafka (docs/kafka.md): the publisher projection handler (:mod:`.publisher`, needs
the ``kafka`` extra) and a local KRaft broker for development and the tests (:mod:`.local`)."""

GROUP_SIZE = 5000
"""Events a batch of ``projections run --to-kafka`` unless the environment sets
``projection.group_size`` (whose default, 1000, suits a handler writing to PostgreSQL). A batch is
one Kafka transaction (exactly once) or one flush (at least once), and a transaction costs the
brokers per transaction more than per record: a bare transactional producer sent 0.43 of an
idempotent one's rate at 1,000 records a transaction and 0.75-0.88 at 5,000, the exactly-once
publisher 53k events/s against 82-112k (docs/kafka.md "Batch size"). 20,000 was faster still
(101-124k) but holds 0.3-0.4 s of a backlog in each transaction (docs/kafka.md "Speed",
"Transaction size"). A batch still closes ``group_max_wait`` after its first event when fewer come."""
