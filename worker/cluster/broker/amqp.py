"""RabbitMQ as the broker (`CHORDFLOW_BROKER_URL=amqp://...`; Redis stays the state store).

Acknowledgements are bound to the consumer's connection: when it closes, every message it held goes back to the
queue at once, so there is no visibility timeout and nothing to renew. What this module sets:

- **Heartbeats** (CHORDFLOW_BROKER_HEARTBEAT, 10 s): a worker host cut off from the broker keeps its TCP
  connection half-open; RabbitMQ drops it after two silent heartbeat intervals and puts its unacknowledged chunk
  back. A `-P solo` worker runs a task inside its consumer loop, which then sends no heartbeats: `SoloHeartbeats`
  sends them from a thread while a task runs, on the consumer's and the event dispatcher's connections (the loop
  does not touch them meanwhile); without them RabbitMQ drops both after two intervals and the worker hangs.
- **The queue**: classic with `x-max-priority` (worker/cluster/priorities.py MAX), so message priorities work; or quorum
  (CHORDFLOW_QUEUE_TYPE=quorum: replicated across broker nodes, no message priorities before RabbitMQ 4.0, and
  Celery detects it and prefetches per consumer instead of a global QoS). Declared with `x-consumer-timeout`
  (CONSUMER_TIMEOUT_MS) so RabbitMQ >= 3.12 does not close the channel of a worker that holds a long chunk;
  older servers ignore it and apply their `consumer_timeout` (30 min by default, rabbitmq.conf).
- **Publisher confirms**: a publish returns once the broker has the message.
- **Queue depth** from a passive declare; the head's age from a `basic_get` of the next message and a reject
  that requeues it (classic queues only: the message keeps its position, only its `redelivered` flag is set,
  which chordflow and Celery ignore; on a quorum queue each such return would count as a delivery attempt).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from kombu import Connection, Exchange, Queue

from worker.cluster import priorities
from worker.cluster.broker.base import READ_TIMEOUT, Broker, QueuesView, QueueView
from worker.cluster.broker.pool import SENT_AT_HEADER
from worker.periodic import Periodic

#: Broker URL schemes of RabbitMQ (kombu's py-amqp transport).
SCHEMES = ("amqp", "amqps", "pyamqp")
#: The queue's `x-consumer-timeout` (ms): a worker may hold one delivery this long (RabbitMQ >= 3.12).
CONSUMER_TIMEOUT_MS = 7 * 24 * 3600 * 1000


class AmqpBroker(Broker):
    def queue_arguments(self) -> dict[str, Any]:
        """The arguments chordflow's queue is declared with (the same on every declare, or RabbitMQ refuses it)."""
        kind = (
            {"x-queue-type": "quorum"} if self.settings.queue_type == "quorum" else {"x-max-priority": priorities.MAX}
        )
        return {**kind, "x-consumer-timeout": CONSUMER_TIMEOUT_MS}

    def app_options(self) -> dict[str, Any]:
        queue, quorum = self.settings.queue, self.settings.queue_type == "quorum"
        # A quorum queue's delayed messages (a retry's countdown) go through Celery's native delayed delivery,
        # which routes by topic: its exchange is a topic one (a classic queue's worker holds them instead).
        exchange = Exchange(queue, type="topic" if quorum else "direct")
        return {
            "broker_heartbeat": self.settings.broker_heartbeat,
            "broker_transport_options": {"confirm_publish": True},
            "task_queues": [Queue(queue, exchange, routing_key=queue, queue_arguments=self.queue_arguments())],
        }

    def reach(self, timeout: float) -> None:
        with Connection(self.settings.broker_url, connect_timeout=timeout, heartbeat=0) as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout)

    def read_queues(self, queues: Iterable[str], now: float) -> QueuesView:
        views = []
        with Connection(self.settings.broker_url, connect_timeout=READ_TIMEOUT, heartbeat=0) as conn:
            conn.ensure_connection(max_retries=1)
            for name in dict.fromkeys(queues):
                channel = conn.channel()
                try:
                    views.append(self._read(channel, name, now))
                finally:
                    if channel.is_open:
                        channel.close()
        return QueuesView(views, None)

    def _read(self, channel: Any, name: str, now: float) -> QueueView:
        try:
            _, messages, _ = channel.queue_declare(name, passive=True)
        except channel.connection.channel_errors:  # NOT_FOUND: not declared yet (no worker ever started)
            return QueueView(name, 0, None)
        if not messages or self.settings.queue_type == "quorum":
            return QueueView(name, messages, None)
        head = channel.basic_get(name, no_ack=False)
        if head is None:
            return QueueView(name, messages, None)
        channel.basic_reject(head.delivery_tag, requeue=True)
        sent = (head.headers or {}).get(SENT_AT_HEADER)
        return QueueView(name, messages, max(0.0, now - float(sent)) if isinstance(sent, int | float) else None)


class SoloHeartbeats(Periodic):
    """Heartbeats of a `-P solo` worker's broker connection while it runs a task (its consumer loop, which sends
    them otherwise, is blocked in the task). `started`/`finished` bracket each task: `finished` returns only once
    no heartbeat is being written, so the loop's acknowledgement never interleaves with one."""

    name = "chordflow-heartbeats"

    def __init__(self, consumer: Any, interval: float):
        super().__init__(interval)
        self.consumer = consumer
        self._running = False
        self._lock = threading.Lock()

    def started(self) -> None:
        with self._lock:
            self._running = True

    def finished(self) -> None:
        with self._lock:
            self._running = False

    def connections(self) -> list[Any]:
        """The py-amqp connections of the worker's main thread: its consumer's and its event dispatcher's (both
        negotiated heartbeats; the loop would have sent them)."""
        owners = (self.consumer, getattr(self.consumer, "event_dispatcher", None))
        found = (getattr(getattr(owner, "connection", None), "connection", None) for owner in owners)
        return list({id(c): c for c in found if c is not None}.values())

    def tick(self) -> None:
        with self._lock:
            if not self._running:
                return
            for connection in self.connections():
                try:
                    connection.send_heartbeat()
                except Exception:  # a broken connection is the consumer loop's to handle
                    continue
