"""Aging of queued messages: a message that waits too long behind higher ones is sent again one level up; one the
broker lost is sent again at its level.

Both brokers hand out the highest priority first, strictly: a low run's advance or chunk already in the queue waits
for as long as higher-priority messages keep arriving, and nothing a worker does later can raise it. So every message
is recorded in its run's keys when it is sent (worker/cluster/sending.py), and forgotten when a delivery of it begins
(`begin`, from every task's `before_start`). Every worker runs a `Sweeper`; at most one sweep starts per interval
across the cluster (a key SET NX for the interval), and it sends a copy of each message that has waited
`CHORDFLOW_PRIORITY_AGING` seconds, at the level that wait earns (priorities.rank: one level up per period; after two
periods a low message goes with the high ones).

A message may never begin: the broker lost it, or it was revoked. On Redis, a worker killed between kombu's BRPOP and
its write of the message to `unacked` loses the message it took; nothing else would ever send it (a top-level one
cannot age). So a sweep sends a message again at its level, under a new id of its family (up to three times), once
its record is older than a dead worker's deliveries take to come back (the broker's `lost_after`) and its list has
let it go: the next message a worker takes from that list was sent after it (lists are first in, first out;
broker/redis.py `heads`). A copy of one a live worker still holds, prefetched, is skipped like any copy.

A message's record goes when a delivery begins, or when its run ends: a cluster run's end trims it (state/runs.py
`trim`), and each sweep forgets the messages of a run that ended, or that a client drove and no longer does (its
`driver` lease ran out: the client ended, or was killed, and its record is in its own embedded store). So nothing of
a client-driven run outlives it by more than the lease and a sweep, whatever killed the client. A cancelled run keeps
them until it ends: it ends when each chunk reported, so a chunk the broker lost must still be sent again.

A copy is the same message under a sibling task id: whichever delivery of the pair begins first runs, the other
is skipped unrun (lua/begin_message.lua), so no item runs twice because of a copy, and a redelivery of the one
that began (its worker died) still runs: it keeps its task id. A chunk's copy carries its window's block numbers
instead of its items (worker/cluster/batches/tasks.py reads them from the window); it still carries its node spec
and snapshot, as every chunk message does.

A recorded message's task id is `<32 hex digits>-<digit>` (sending.py `tracked_id`: its rank, and the times it was
sent again at it); any other id (Celery's own) costs nothing at `begin`. Keys: the run's `queued`, `queued_msgs`,
`copies` and `begun` (worker/cluster/state/keys.py), and `cf:{queued}`, the runs that have queued messages.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import msgpack
import redis

from worker.cluster import priorities
from worker.cluster.sending import RANKS, forget, rank_of, resend, tracked_id
from worker.cluster.sending import client as _client
from worker.cluster.state.keys import AGING_SWEEP, QUEUED, RunKeys
from worker.cluster.state.runstate import script
from worker.periodic import Periodic
from worker.runs.record import FINAL

log = logging.getLogger(__name__)

#: A recorded message's task id: its family's id and its digit (sending.py `tracked_id`).
TRACKED = re.compile(r"^([0-9a-f]{32})-([0-9])$")
#: Messages copied per run per sweep, at most (the oldest first); the rest wait for the next sweep.
PER_SWEEP = 500


def begin(client: redis.Redis, run_id: str | None, task_id: str, ttl: int) -> bool:
    """A delivery of task `task_id` begins: False when another delivery of its message (a copy, or the original
    it copies) began first, and this one is to be skipped. One round trip for a tracked message, none otherwise."""
    tracked = TRACKED.match(task_id or "")
    if tracked is None or run_id is None:
        return True
    family = [f"{tracked.group(1)}-{digit}" for digit in range(10)]
    k = RunKeys(run_id)
    keys = [k.queued, k.queued_messages, k.copies, k.begun]
    return bool(script(client, "begin_message")(keys=keys, args=[task_id, ttl, *family]))


def sweep(app: Any, now: float | None = None) -> int:
    """Copy every recorded message that has waited a period at the level its wait earns, and send again every one
    the broker lost; returns how many were sent."""
    s, client = app.chordflow_settings, _client(app)
    now = time.time() if now is None else now
    lost = Lost(app.chordflow_broker, s.queue, now)
    copied, forget_run = 0, script(client, "forget_queued")
    for raw in client.zrange(QUEUED, 0, -1):
        run_id = raw.decode()
        keys = RunKeys(run_id)
        queued, messages = keys.queued, keys.queued_messages
        pipe = client.pipeline(transaction=False)
        forget_run(keys=[keys.run, keys.driver, queued, messages], args=list(FINAL), client=pipe)
        due_at = now - min(s.priority_aging, lost.after or s.priority_aging)
        pipe.zrangebyscore(queued, "-inf", due_at, start=0, num=PER_SWEEP, withscores=True)
        pipe.exists(queued)
        forgotten, due, left = pipe.execute()
        if forgotten:  # its run ended (or its driver is gone): its messages do nothing now, no copies
            unlist(client, run_id)
            continue
        if not due and not left:
            unlist(client, run_id)
            continue
        due = [
            (task_id.decode(), sent)
            for task_id, sent in due
            if _worth_a_look(task_id.decode(), sent, lost, s.priority_aging)
        ]
        packed = client.hmget(messages, [task_id for task_id, _ in due]) if due else []
        for (task_id, sent), message in zip(due, packed, strict=True):
            copied += _copy(app, run_id, task_id, sent, message, now, lost)
    return copied


class Lost:
    """What one sweep knows for telling a lost message: the broker's `lost_after` (None: it loses none, RabbitMQ) and
    the next message of each list of the queue (read once, when first asked)."""

    #: Seconds one host's clock may be ahead of another's: a list's next message must be sent this much after.
    SKEW = 1.0

    def __init__(self, broker: Any, queue: str, now: float):
        self.broker, self.queue, self.now, self.after = broker, queue, now, broker.lost_after()
        self._heads: dict[int, float] | None = None

    def passed(self, numbers: tuple[int, ...], sent: float) -> bool:
        """Whether one of the lists of priority `numbers` has let a message sent at `sent` go (every message in it
        now was sent after it), once its record waited `after` seconds."""
        if self.after is None or self.now - sent < self.after:
            return False
        if self._heads is None:
            self._heads = self.broker.heads(self.queue)
        return any(self._heads.get(n, float("inf")) > sent + self.SKEW for n in numbers)


def _worth_a_look(task_id: str, sent: float, lost: Lost, aging: float) -> bool:
    """Whether a due record's message is worth reading (its packed message, maybe large): due for aging, or maybe
    lost (a list of its rank, either kind, passed it: its message says which list is its own)."""
    tracked = TRACKED.match(task_id)
    if tracked is None:
        return True  # read, then forgotten
    rank = rank_of(tracked.group(2))[0]
    return (rank > 0 and lost.now - sent >= aging) or lost.passed((2 * rank, 2 * rank + 1), sent)


def unlist(client: redis.Redis, run_id: str) -> None:
    """Take a run with nothing queued off the index of runs to sweep. A message the run sends between the sweep's
    look at its queue and this ZREM has already put the run back in the index (its send ZADDs the queue first,
    the index next) and the ZREM would take it out again, its message never swept, its run starved: so the queue
    is looked at once more after, and the run put back if it has one."""
    client.zrem(QUEUED, run_id)
    if client.exists(RunKeys(run_id).queued):
        client.zadd(QUEUED, {run_id: time.time()})


def _copy(app: Any, run_id: str, task_id: str, sent: float, packed: bytes | None, now: float, lost: Lost) -> int:
    """Send a copy of one queued message one level up, if its wait earned it, or at its level if the broker lost it;
    returns 1 if sent.

    The pair is written in `copies` before the message is forgotten: a delivery of it that begins after that
    contends with the copy (lua/begin_message.lua), and one that began before has forgotten it already, so no
    copy goes."""
    s, client = app.chordflow_settings, _client(app)
    tracked = TRACKED.match(task_id)
    if packed is None or tracked is None:
        forget(client, run_id, task_id)
        return 0
    name, args, priority, kind, first_sent, options = msgpack.unpackb(packed, strict_map_key=False)
    waited = now - first_sent
    first, (rank, again) = tracked.group(1), rank_of(tracked.group(2))
    earned = priorities.rank(priority, waited, s.priority_aging)
    if earned < rank:
        target, why = (
            tracked_id(first, earned),
            "waited %.0f s in the queue behind higher priorities: sent again one level up",
        )
    elif earned == rank and rank + RANKS * (again + 1) <= 9 and lost.passed((2 * rank + kind,), sent):
        target, why = tracked_id(first, rank, again + 1), "was lost by the broker (sent %.0f s ago): sent again"
    else:
        return 0  # not due yet, a clock step, or sent again as often as its id can say
    keys = RunKeys(run_id)
    copies = keys.copies
    pipe = client.pipeline(transaction=False)
    pipe.hset(copies, mapping={task_id: first, target: first})
    pipe.expire(copies, s.run_ttl)
    pipe.execute()
    if not forget(client, run_id, task_id):
        return 0  # began meanwhile
    try:
        resend(app, name, tuple(args), run_id, priority, kind, waited, first, tuple(args), options,
               again=0 if earned < rank else again + 1)  # fmt: skip
    except BaseException:  # the copy never went: the original is watched again, to be copied by a later sweep
        pipe = client.pipeline(transaction=False)
        pipe.zadd(keys.queued, {task_id: sent})
        pipe.hset(keys.queued_messages, task_id, packed)
        pipe.zadd(QUEUED, {run_id: now})
        pipe.execute()
        raise
    log.info("run %s: %s " + why, run_id, name, waited)
    return 1


class Sweeper(Periodic):
    """A worker's aging sweeps, every quarter of `CHORDFLOW_PRIORITY_AGING` (at most every 5 s), until `stop()`;
    at most one sweep of the cluster starts per interval (two that overlap are safe: forgetting a message is one
    ZREM, and only the sweep that removed it copies it)."""

    name = "chordflow-aging"

    def __init__(self, app: Any):
        super().__init__(min(5.0, app.chordflow_settings.priority_aging / 4))
        self.app = app

    def tick(self) -> None:
        try:
            if _client(self.app).set(AGING_SWEEP, 1, nx=True, px=int(self.interval * 1000)):
                with self.app.backend.quiet():  # nobody waits on a copy's Celery result: no subscription per copy
                    sweep(self.app)
        except Exception as exc:  # Redis or the broker away for a moment: the next sweep tries again
            log.warning("could not sweep queued messages for aging: %s", exc)
