"""Errors raised by the client itself, beside the wire errors of ``eos_protocol.errors``.

The wire errors say what a server answered. These say what the client decided::

    ClientError
    ├── IllegalStateError          a call made out of order (send before begin_transaction)
    ├── ProducerClosedError        a call on a closed producer or consumer
    ├── TransactionAbortedError    a record dropped because its transaction was aborted
    ├── NetworkError               the server could not be reached, and the request is not
    │                              one that may be sent twice
    └── EosTimeoutError            an operation did not finish in time
        └── DeliveryTimeoutError   a record was not acknowledged within delivery_timeout_ms
"""

from __future__ import annotations


class ClientError(Exception):
    """Base of the errors the client raises on its own account.

    Example::

        try:
            producer.commit_transaction()
        except EosTimeoutError:
            producer.commit_transaction()  # still COMMITTING: try again
    """


class IllegalStateError(ClientError):
    """The call is not valid in the producer's current state (see ``ProducerState``).

    Example::

        producer.send("orders", "x")  # before begin_transaction: IllegalStateError
    """


class ProducerClosedError(ClientError):
    """The client was closed.

    Example::

        producer.close()
        producer.send("orders", "x")  # ProducerClosedError
    """


class TransactionAbortedError(ClientError):
    """The record was never sent: its transaction was aborted first.

    Example::

        future = producer.send("orders", "x")
        producer.abort_transaction()
        future.exception()  # TransactionAbortedError (unless it had left already)
    """


class NetworkError(ClientError):
    """A connection or protocol failure on a request that is not safe to send again.

    Example::

        try:
            admin.create_topic("orders", 3)
        except NetworkError:
            admin.create_topic("orders", 3, exist_ok=True)  # it may have been created
    """


class EosTimeoutError(ClientError, TimeoutError):
    """An operation did not finish before its deadline. Retrying the call is safe.

    Example::

        producer.flush(timeout=5.0)  # EosTimeoutError if records are still unacknowledged
    """


class DeliveryTimeoutError(EosTimeoutError):
    """A record was not acknowledged within ``delivery_timeout_ms``; its fate is unknown,
    so a transactional producer must abort and an idempotent one takes a new producer id.

    Example::

        producer = Producer(url, delivery_timeout_ms=10_000)
        producer.send("orders", "x").exception()  # DeliveryTimeoutError if no node answered
    """


def copy_error(exc: BaseException) -> BaseException:
    """A fresh instance of a stored error, so each call that re-raises it gets its own
    traceback (the stored one stays the cause)."""
    from eos_protocol.errors import EosError

    if isinstance(exc, EosError):
        return type(exc)(exc.message, details=exc.details)
    if isinstance(exc, ClientError):
        return type(exc)(*exc.args)
    return ClientError(repr(exc))
