"""Schedules in Redis: each one's template, which is all a worker needs to make a run of it without the client (the
workflow, its initial store already in the snapshot codec, its cron, timezone and catchup), and when it next fires.

`cf:{schedules}` maps a name to its template, packed with msgpack; `cf:{schedules}:due` maps the name of each active
schedule to its next fire time (a paused schedule has no entry there). What the client chose is signed by it
(`Schedule.spec`, worker/cluster/signing.py `sign_schedule`); what changes as it runs (paused, the last fire and its
run) is not signed, and every change is a transaction watching the hash: a pause, a removal or a replacement that
comes while a sweep fires the schedule is never undone by that sweep (worker/cluster/schedules.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack
import redis

from ir.errors import NewerFormat
from worker.cluster.state.keys import SCHEDULES, SCHEDULES_DUE

#: The template format this release writes (and reads, up to it).
FORMAT = 1
#: The fields of a template its signature covers: everything the client chose.
SIGNED = (
    "name", "version", "cron", "timezone", "catchup", "workflow", "store", "start", "source", "priority", "created",
)  # fmt: skip

T = TypeVar("T")


@dataclass
class Schedule:
    """A schedule's template: a run of `workflow` with `store` (top-level key -> snapshot-codec bytes, as a run's
    store is kept) at each time `cron` names in `timezone`."""

    name: str
    version: str  # one per `add`: a schedule replaced under the same name is told from its replacement
    cron: str
    timezone: str
    catchup: str  # none, last or all: the fires missed while no worker swept (worker/cluster/schedules.py)
    workflow: dict[str, Any]  # the validated IR, as wire JSON (a run record's `workflow`)
    store: dict[str, bytes]
    start: str | None  # the run's first node
    source: str | None  # the workflow file it was added from, if any
    priority: str
    created: float
    signature: str = ""  # of `spec()`, by the client that added it ("" when it ran insecure)
    paused: bool = False
    last_fire: int | None = None  # the latest fire that made a run, and that run
    last_run: str | None = None
    format: int = FORMAT

    def spec(self) -> dict[str, Any]:
        """What the signature covers (SIGNED), as a worker reads it back."""
        return {name: getattr(self, name) for name in SIGNED}

    def pack(self) -> bytes:
        return msgpack.packb(dataclasses.asdict(self), use_bin_type=True)

    @classmethod
    def unpack(cls, raw: bytes) -> Schedule:
        """NewerFormat for a template a newer release wrote (this one leaves it alone)."""
        fields = msgpack.unpackb(raw, raw=False)
        if fields.get("format", 0) > FORMAT:
            raise NewerFormat(f"schedule {fields.get('name')!r}: template format {fields['format']}; this release "
                              f"reads up to {FORMAT}")  # fmt: skip
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in fields.items() if name in known})


class Schedules:
    """The schedules of one cluster, in its state Redis (the keys above)."""

    def __init__(self, client: redis.Redis):
        self.redis = client

    def put(self, schedule: Schedule, next_fire: int) -> Schedule | None:
        """Add `schedule`, active, first firing at `next_fire`; one of the same name is replaced (its last fire and
        run are kept: fires it made are not made again). Returns the one replaced, if any."""

        def change(current: Schedule | None, pipe: redis.client.Pipeline) -> Schedule | None:
            if current is not None:
                schedule.last_fire, schedule.last_run = current.last_fire, current.last_run
            pipe.hset(SCHEDULES, schedule.name, schedule.pack())
            pipe.zadd(SCHEDULES_DUE, {schedule.name: next_fire})
            return current

        return self._change(schedule.name, change)

    def get(self, name: str) -> Schedule | None:
        raw = self.redis.hget(SCHEDULES, name)
        return None if raw is None else Schedule.unpack(raw)

    def listed(self) -> list[tuple[Schedule, int | None]]:
        """Every schedule, by name, with its next fire time (None: paused)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hgetall(SCHEDULES)
        pipe.zrange(SCHEDULES_DUE, 0, -1, withscores=True)
        templates, due = pipe.execute()
        when = {name.decode(): int(score) for name, score in due}
        found = [Schedule.unpack(raw) for raw in templates.values()]
        return [(each, when.get(each.name)) for each in sorted(found, key=lambda s: s.name)]

    def remove(self, name: str) -> bool:
        """False when there is no such schedule."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(SCHEDULES, name)
        pipe.zrem(SCHEDULES_DUE, name)
        return bool(pipe.execute()[0])

    def pause(self, name: str) -> Schedule | None:
        """No fire until `resume`; None when there is no such schedule."""

        def change(current: Schedule | None, pipe: redis.client.Pipeline) -> Schedule | None:
            if current is not None:
                current.paused = True
                pipe.hset(SCHEDULES, name, current.pack())
                pipe.zrem(SCHEDULES_DUE, name)
            return current

        return self._change(name, change)

    def resume(self, name: str, next_fire: Callable[[Schedule], int]) -> Schedule | None:
        """Active again, first firing at `next_fire(schedule)`; None when there is no such schedule."""

        def change(current: Schedule | None, pipe: redis.client.Pipeline) -> Schedule | None:
            if current is not None:
                current.paused = False
                pipe.hset(SCHEDULES, name, current.pack())
                pipe.zadd(SCHEDULES_DUE, {name: next_fire(current)})
            return current

        return self._change(name, change)

    def due(self, now: float, limit: int) -> list[tuple[str, int]]:
        """The active schedules whose next fire time has come, the most overdue first: (name, that time)."""
        found = self.redis.zrangebyscore(SCHEDULES_DUE, "-inf", now, start=0, num=limit, withscores=True)
        return [(name.decode(), int(score)) for name, score in found]

    def fired(self, schedule: Schedule, last: tuple[int, str] | None, next_fire: int) -> None:
        """After a sweep made the runs of `schedule`'s due fires: keep the last fire and its run (`last`, if it made
        one) and, while this very schedule is still active, set its next fire time. A schedule paused, removed or
        replaced meanwhile keeps what that change wrote."""

        def change(current: Schedule | None, pipe: redis.client.Pipeline) -> None:
            if current is None or current.version != schedule.version:
                return
            if last is not None and (current.last_fire or 0) < last[0]:
                current.last_fire, current.last_run = last
                pipe.hset(SCHEDULES, current.name, current.pack())
            if not current.paused:
                pipe.zadd(SCHEDULES_DUE, {current.name: next_fire})

        self._change(schedule.name, change)

    def forget(self, name: str) -> None:
        """Take the due entry of a schedule removed or paused off the due list (never an active one's: one added
        again meanwhile keeps its own)."""

        def change(current: Schedule | None, pipe: redis.client.Pipeline) -> None:
            if current is None or current.paused:
                pipe.zrem(SCHEDULES_DUE, name)

        self._change(name, change)

    def drop_due(self, name: str) -> None:
        """Take a schedule off the due list (a worker refused it): it fires no more until added again."""
        self.redis.zrem(SCHEDULES_DUE, name)

    def _change(self, name: str, change: Callable[[Schedule | None, redis.client.Pipeline], T]) -> T:
        """`change(the schedule now, a transaction)`: the transaction runs only if no schedule changed meanwhile, else
        `change` is called again with what is there then."""
        with self.redis.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(SCHEDULES)
                    raw = pipe.hget(SCHEDULES, name)
                    current = None if raw is None else Schedule.unpack(raw)
                    pipe.multi()
                    result = change(current, pipe)
                    pipe.execute()
                    return result
                except redis.WatchError:
                    continue
