"""Redis or the broker out of reach: ride it out for a while, then give the work back — never fail it.

Every Redis command of a worker retries lost connections and timeouts for `CHORDFLOW_OUTAGE_SECONDS` (a
restart, a failover, a short network cut end unnoticed). Past that budget the task that was running raises
one of ERRORS; `GivesBack` (worker/cluster/app.py), the base of every chordflow task, turns it into a Celery
`Reject(requeue=True)` with one WARNING line: nothing is stored for the task (no failure, no batch error), and
its message is delivered again — requeued by this worker if it can still reach the broker, else swept back by a live
worker once its delivery lease lapses (worker/cluster/broker/deliveries.py). When this worker is back it finds its
claims taken over and stops at its next write (fencing). Only a node's own errors fail items and runs.

A node that talks to a Redis of its own and lets redis-py's connection errors escape is given back too:
such a node should raise its own error instead.

Celery is not imported here: a client following a run (`chordflow wait`, `results`) uses these Redis options
and no task.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import kombu.exceptions
import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from ir.errors import Outage
from worker import settings

#: What "chordflow's own state is out of reach" looks like once the budget is spent.
ERRORS: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    kombu.exceptions.OperationalError,
    Outage,
)

T = TypeVar("T")


def budget() -> float:
    """Seconds a command keeps retrying a lost connection before it fails."""
    return float(settings.load().outage_seconds)


class DeadlineRetry(Retry):
    """redis-py's Retry bounded by time, not by a count of tries: a try that hangs until its socket timeout
    uses the budget as a quick refusal does, so a cut network and a stopped server give up alike."""

    def __init__(self, seconds: float):
        super().__init__(ExponentialBackoff(cap=1.0, base=0.05), retries=-1)
        self.seconds = seconds

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        self._backoff.reset()
        deadline, failures = time.monotonic() + self.seconds, 0
        while True:
            try:
                return do()
            except self._supported_errors as error:
                if is_retryable and not is_retryable(error):
                    raise
                failures += 1
                fail(error, failures) if with_failure_count else fail(error)
                pause = self._backoff.compute(failures)
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)


def redis_options() -> dict[str, Any]:
    """Connection options of every chordflow Redis client: each command rides out an outage of up to the
    budget, backing off to 1 s between tries (a few tries in the first second)."""
    return {"retry": DeadlineRetry(budget()), "retry_on_error": [redis.ConnectionError, redis.TimeoutError]}
