"""Sending a message (worker/cluster/messages.py) to the broker, at its run's priority.

Every message is recorded in its run's keys (`queued`, `queued_msgs`) before it goes, so that aging
(worker/cluster/aging.py) can send a copy of it one level up if it waits too long, or again at its level if the broker
lost it; what is recorded is the copy's arguments and the send's options, packed. A recorded message's task id is
`<32 hex digits>-<digit>`: the digit is its rank plus 3 for each time it was sent again at that rank (`tracked_id`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgpack
import redis

from ir.priorities import PRIORITIES
from worker.cluster import priorities
from worker.cluster.messages import Message
from worker.cluster.state.keys import QUEUED, RunKeys
from worker.cluster.state.runstate import client as state_client

#: Ranks (high, normal, low): a recorded message's id digit is its rank plus RANKS per time it was sent again at it.
RANKS = len(PRIORITIES)


def send(app: Any, message: Message, *, priority: str, kind: int, waited: float = 0.0, copy: Message | None = None,
         **options: Any) -> str:  # fmt: skip
    """Send `message` at its run's `priority` aged by `waited` seconds, recorded so that aging can send it again.
    `copy`: what such a copy carries (default: the message). Returns the task id."""
    recorded = (copy or message).to_wire()
    return resend(app, message.name, message.to_wire(), message.run, priority, kind, waited, uuid.uuid4().hex,
                  recorded, options)  # fmt: skip


def tracked_id(first: str, rank: int, again: int = 0) -> str:
    """The task id of message family `first` at `rank`, sent `again` times before at that rank (0-3 for the top rank,
    0-2 below: one digit)."""
    return f"{first}-{rank + RANKS * again}"


def rank_of(digit: str) -> tuple[int, int]:
    """The rank and the times sent again at it of a recorded message's id digit (`tracked_id`)."""
    return int(digit) % RANKS, int(digit) // RANKS


def resend(app: Any, name: str, args: tuple[Any, ...], run_id: str, priority: str, kind: int, waited: float,
           first: str, recorded: tuple[Any, ...], options: dict[str, Any], again: int = 0) -> str:  # fmt: skip
    """Send task `name`'s arguments under the task id family `first`, at the rank `waited` earns, `again` times sent
    at it before (aging sends its copies through here, from what `send` recorded)."""
    s = app.chordflow_settings
    rank = priorities.rank(priority, waited, s.priority_aging)
    number = priorities.message_priority(s.broker_url, priority, kind, waited, s.priority_aging)
    task_id = tracked_id(first, rank, again)
    # recorded before it is sent: a worker may begin it at once, and its begin forgets it
    now = time.time()
    packed = msgpack.packb([name, list(recorded), priority, kind, now - waited, options])
    keys, pipe = RunKeys(run_id), client(app).pipeline(transaction=False)
    pipe.zadd(keys.queued, {task_id: now})
    pipe.hset(keys.queued_messages, task_id, packed)
    for key in (keys.queued, keys.queued_messages):
        pipe.expire(key, s.run_ttl)
    pipe.zadd(QUEUED, {run_id: now})
    pipe.execute()
    try:
        app.send_task(name, args, task_id=task_id, priority=number, **options)
    except BaseException:
        forget(client(app), run_id, task_id)  # never sent: nothing to copy
        raise
    return task_id


def forget(redis_client: redis.Redis, run_id: str, task_id: str) -> int:
    """Stop watching a message; returns 1 if it was watched."""
    keys, pipe = RunKeys(run_id), redis_client.pipeline(transaction=False)
    pipe.zrem(keys.queued, task_id)
    pipe.hdel(keys.queued_messages, task_id)
    return int(pipe.execute()[0])


def client(app: Any) -> redis.Redis:
    """The Redis of `app`'s run state."""
    return state_client(app.chordflow_settings.result_backend)
