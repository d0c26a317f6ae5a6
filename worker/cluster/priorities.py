"""Where a run's messages go in the queue: by its priority (high, normal, low), what they are, and their age.

A run's advances and the task that merges a batch are short and start or finish a step: they go one step before
the chunks of the same priority. Both kinds go by the run's priority. A batch's chunks age: they go one level up
for every `CHORDFLOW_PRIORITY_AGING` seconds its last finished chunk waited in the queue (claimed to begun), so
a low batch that higher ones keep waiting catches up with them (after two such waits it goes with the high
ones), while a long batch on a cluster with room keeps its level. A message keeps the level it was sent with;
a batch's chunks are sent a bounded window at a time (worker/cluster/batches/dispatch.py), so a higher run's
chunks pass at most one window of a lower run's. A message already queued that waits a period is sent again one
level up (worker/cluster/aging.py), so a low run none of whose messages reaches a worker is never stuck.

Redis (kombu's priority steps, one list per step) takes 0 first; RabbitMQ (`x-max-priority` queues) takes the
highest first: `message_priority` gives the number each broker orders the same way.
"""

from __future__ import annotations

from ir.priorities import PRIORITIES

#: An advance, or the task that merges a batch's chunks: before the chunks of the same priority.
CONTROL = 0
#: A batch's chunk.
CHUNK = 1
#: kombu's Redis transport: one list per step, polled lowest first.
STEPS = list(range(10))
#: The most a message's number can be (RabbitMQ queues are declared with x-max-priority at least this).
MAX = 9


def rank(priority: str, waited: float = 0.0, aging: float = 60.0) -> int:
    """0 (high) to 2 (low): the run's priority raised one level per `aging` seconds waited."""
    base = PRIORITIES.index(priority) if priority in PRIORITIES else PRIORITIES.index("normal")
    return max(0, base - int(max(0.0, waited) // max(aging, 1e-9)))


def message_priority(broker_url: str, priority: str, kind: int, waited: float = 0.0, aging: float = 60.0) -> int:
    """The message priority for `broker_url`'s transport: Redis orders 0 first, AMQP the highest first."""
    order = 2 * rank(priority, waited, aging) + kind  # 0 (a high run's advance) .. 5 (a low run's chunk)
    return order if broker_url.startswith(("redis", "rediss", "sentinel")) else MAX - order


def transport_options() -> dict[str, object]:
    """kombu's Redis transport options that make message priorities count (ignored by other transports)."""
    return {"priority_steps": STEPS}
