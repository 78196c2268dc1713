"""Events out to Kafka (docs/kafka.md): the publisher projection handler (:mod:`.publisher`, needs
the ``kafka`` extra) and a local KRaft broker for development and the tests (:mod:`.local`)."""
