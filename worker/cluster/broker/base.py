"""What differs between brokers, behind one small interface (`Broker`); everything else is written once over it.

A broker module (redis.py, amqp.py) implements three primitives: the Celery settings its connections and queue
need (`app_options`, priorities included: worker/cluster/priorities.py numbers them for either broker), whether a
dead worker's deliveries come back only after a visibility timeout that live workers must keep renewing
(`renews_deliveries`), and each queue's depth and the age of the message a worker takes next (`read_queues`);
`reach` checks a broker the Redis preflight does not; `heads` says, on a broker that can lose a message a worker
took, when the next message of each priority was sent (worker/cluster/aging.py sends a lost one again).
Revoking queued chunks (`app.control.revoke`) is Celery's broadcast on both brokers: nothing broker-specific.
registry.py picks the module by the broker URL's scheme.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from worker import settings

#: Seconds a metrics read of the broker may take (connecting included) before it fails.
READ_TIMEOUT = 5.0


@dataclass
class QueueView:
    """One queue as the broker sees it now."""

    name: str
    messages: int  # waiting, not yet delivered to a worker
    oldest_age: float | None  # seconds since the next message a worker takes was sent; None: empty or not known


@dataclass
class QueuesView:
    queues: list[QueueView]
    unacked: int | None  # messages delivered and not yet acknowledged; None: the broker does not say


class Broker(ABC):
    """The broker of one settings value (`s.broker_url`, `s.queue` and the broker's own settings)."""

    #: True when a dead worker's deliveries come back only after a visibility timeout (kombu's Redis transport
    #: emulates acknowledgements), so live workers renew theirs and fence stale ones (broker/deliveries.py).
    renews_deliveries: bool = False

    def __init__(self, s: settings.Settings):
        self.settings = s

    @abstractmethod
    def app_options(self) -> dict[str, Any]:
        """Celery settings for this broker: transport, transport options, heartbeats, the declared queue."""

    @abstractmethod
    def reach(self, timeout: float) -> None:
        """Connect once within `timeout` seconds, raising the transport's error (kombu's OperationalError, OSError)
        when the broker is not there: the preflight of a run."""

    @abstractmethod
    def read_queues(self, queues: Iterable[str], now: float) -> QueuesView:
        """Each queue's waiting messages and its head's age (`chordflow metrics`, `top`); raises on a broker that
        does not answer within READ_TIMEOUT."""

    def lost_after(self) -> float | None:
        """Seconds after which a message a worker took and never began is lost, not on its way back (a dead worker's
        deliveries are back by then), on a broker that can lose a message a worker took and died before recording it
        held; None on a broker that loses none so (RabbitMQ puts a dead consumer's unacknowledged messages back)."""
        return None

    def heads(self, queue: str) -> dict[int, float]:
        """When the next message a worker takes from each priority number of `queue` was sent (a number whose list
        is empty is absent); only asked of a broker with a `lost_after`."""
        raise NotImplementedError
