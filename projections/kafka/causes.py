"""What a Kafka error means for a publishing projection (docs/kafka.md, "When Kafka says no"):

- the brokers refuse the projection itself: a login refused (wrong password), an ACL denying
  the topic, the offsets topic or the transactional id. Every event would be refused alike, so
  it is :class:`~journal.errors.DestinationRefused`: the projection stops at once, in one line;
- the brokers do not answer (down, cut off, no leader or coordinator yet, too few in-sync
  replicas, a call that timed out): :class:`~journal.errors.DestinationUnavailable`, an outage
  the runner waits out without counting it toward ``handler_attempts``;
- a producer fenced by a newer one of its transactional id (:data:`FENCED`): the publisher
  says whose (``publisher._Range._fenced``);
- anything else refuses this batch (a record over the size limit):
  :class:`~journal.errors.KafkaPublishError`, to which the failure strategy applies (a retry, a
  dead letter for the one event).

librdkafka reports a refused login to the client's error callback, and the call that needed the
connection then fails with a timeout or a transport error: :class:`Refusals` is that callback,
and a failure is read together with the last refusal it saw since a call last succeeded.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

REFUSED = frozenset({
    KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
})  # fmt: skip
"""The brokers refuse the client's login or permissions."""

UNAVAILABLE = frozenset({
    KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE, KafkaError._TIMED_OUT,
    KafkaError._TIMED_OUT_QUEUE, KafkaError._MSG_TIMED_OUT, KafkaError._WAIT_COORD, KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION, KafkaError.BROKER_NOT_AVAILABLE, KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.NOT_ENOUGH_REPLICAS, KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.CONCURRENT_TRANSACTIONS,
})  # fmt: skip
"""No broker answers, or not the one a call needs (yet): what a broker down or cut off gives (a
restarted broker's coordinator still ending the transaction left open: ``CONCURRENT_TRANSACTIONS``
from ``init_transactions``)."""

FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
"""A newer producer of the same transactional id took over (its ``init_transactions``)."""


class Refusals:
    """A client's ``error_cb``: keeps the last refusal (:data:`REFUSED`) the client reported."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: KafkaError | None = None

    def __call__(self, err: KafkaError) -> None:
        if err.code() in REFUSED:
            self.last = err

    def clear(self) -> None:
        """After a call that succeeded: the login works (a refusal seen before was passing, the
        login of a connection cut while it was made, say)."""
        self.last = None

    def cause(self, err: KafkaError) -> KafkaError:
        """``err``, or the refusal behind it when ``err`` only says that no answer came."""
        if err.code() in UNAVAILABLE and self.last is not None:
            return self.last
        return err


def refused(err: KafkaError) -> bool:
    return err.code() in REFUSED


def unavailable(err: KafkaError) -> bool:
    return err.code() in UNAVAILABLE


def login_refused(err: KafkaError) -> bool:
    return err.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED)


def hint(err: KafkaError) -> str:
    """What to check, for a refusal (:data:`REFUSED`)."""
    code = err.code()
    if login_refused(err):
        return "check sasl.username and sasl.password"
    if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return "an ACL must allow WRITE and DESCRIBE on the transactional ids 'sj.<projection>.' (prefixed)"
    if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return "an ACL must allow WRITE and DESCRIBE on the topic and READ on the offsets topic"
    return "check the ACLs of the projection's user"
