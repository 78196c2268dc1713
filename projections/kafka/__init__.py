"""Events out to Kafka: a local broker for development and the tests (:mod:`.local`)."""
