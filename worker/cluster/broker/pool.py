"""Sending to the broker never waits without a bound: the producer pool asks for its connection with a timeout.

Celery bounds the wait for a free producer (`broker_pool_acquire_timeout`, from CHORDFLOW_POOL_TIMEOUT), but
kombu's ProducerPool then takes a connection from the app's connection pool with no timeout: a process
whose `broker_pool_limit` connections are all held elsewhere (threads each running a batch, a leak) would
block that send forever. Here the same timeout applies to both waits, ending in one clear error.
"""

from __future__ import annotations

import time
from typing import Any

from kombu.exceptions import LimitExceeded, OperationalError
from kombu.pools import ProducerPool

from worker.cluster.signing import SigningAMQP

#: The start of every "the pool stayed busy" error (scheduler/backends/celery.py shows it as it is).
POOL_TIMEOUT_MESSAGE = "Timed out waiting for a broker connection"
#: The message header holding when a task message was sent (unix seconds): how long the oldest message of a
#: queue has waited (`chordflow metrics`), how long a task waited before it started. Not signed: a forged
#: value misleads a metric, never a worker.
SENT_AT_HEADER = "chordflow_sent_at"


class BoundedProducerPool(ProducerPool):
    """kombu's ProducerPool, whose producers wait at most `timeout` seconds for a pool connection."""

    def __init__(self, connections: Any, *, timeout: float, **kwargs: Any):
        super().__init__(connections, **kwargs)
        self.timeout = timeout

    def _acquire_connection(self) -> Any:
        try:
            return self.connections.acquire(block=True, timeout=self.timeout)
        except LimitExceeded as exc:
            raise OperationalError(
                f"{POOL_TIMEOUT_MESSAGE} after {self.timeout:g}s: all {self.connections.limit} connections of "
                "this process are in use (raise CHORDFLOW_POOL_TIMEOUT, or send from fewer threads at once)"
            ) from exc


class ChordflowAMQP(SigningAMQP):
    """The app's message layer: signed messages (SigningAMQP) stamped with the time they were sent, sent
    through a BoundedProducerPool.

    `_producer_pool` is where Celery's own AMQP keeps its pool, and what it resets after a fork."""

    def as_task_v2(self, task_id: str, name: str, *args: Any, **kwargs: Any) -> Any:
        message = super().as_task_v2(task_id, name, *args, **kwargs)
        message.headers[SENT_AT_HEADER] = time.time()
        return message

    @property
    def producer_pool(self) -> BoundedProducerPool:
        if self._producer_pool is None:
            connections = self.app.pool
            timeout = self.app.conf.broker_pool_acquire_timeout
            self._producer_pool = BoundedProducerPool(connections, limit=connections.limit, timeout=timeout)
        return self._producer_pool
