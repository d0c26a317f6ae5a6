"""`wait`: the run waits for a time (`seconds`, `until`) or an event (`event`, with an optional `timeout`).

No worker is held meanwhile on a cluster: the run's store records the wait and its advance ends
(worker/cluster/waits.py); a local run's process sleeps. What the run waits for, and for how long, is fixed the
first time the node runs at its step (worker/waits.py), so a resumed run does not wait again from the start.
A wait runs at a run's top level only: not as a batch, in a parallel branch or in a sub-workflow, where it would
hold what runs them (worker/engine/loader.py refuses it there).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pocketflow import Node

from ir import durations
from ir.errors import EventTimedOut
from worker.engine import context
from worker.nodes.params import Param
from worker.nodes.registry import register
from worker.waits import MemoryWaits, Waiting, clock

NODE_TYPE = "wait"
#: The params of which a wait has exactly one: what it waits for.
WHAT = ("seconds", "until", "event")


def instant(value: Any) -> float | None:
    """Epoch seconds of an ISO 8601 time with its zone (`2026-12-05T06:00:00Z`), else None."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    return None if moment.tzinfo is None else moment.timestamp()


def span(value: Any) -> float | None:
    """Seconds of a duration (`24h`, `90s`) or a number of seconds, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value >= 0 else None
    found = durations.seconds(value) if isinstance(value, str) else None
    return None if found is None else float(found)


PARAMS = {
    "seconds": Param("wait this many seconds (a number, or a duration like 90s, 30m, 12h)", (int, float, str),
                     what=f"a number of seconds or a duration {durations.EXAMPLES}",
                     check=lambda v: span(v) is not None),
    "until": Param("wait until this time: ISO 8601 with its zone, like 2026-12-05T06:00:00Z", str,
                   what="an ISO 8601 time with its zone, like 2026-12-05T06:00:00Z",
                   check=lambda v: instant(v) is not None),
    "event": Param("wait for this event: `chordflow signal RUN EVENT [--data JSON]`; its data lands in `data`", str,
                   empty_is_missing=True),
    "timeout": Param("with `event`: give up after this long (a duration like 24h, or seconds): the node's error",
                     (int, float, str), what=f"a number of seconds or a duration {durations.EXAMPLES}",
                     check=lambda v: span(v) is not None),
}  # fmt: skip


def check_params(params: dict[str, Any]) -> str | None:
    """Exactly one of seconds, until and event; a timeout only with an event."""
    given = [name for name in WHAT if params.get(name) not in (None, "")]
    if len(given) != 1:
        named = " and ".join(f"'{n}'" for n in given) if given else "none"
        return f"a wait needs exactly one of 'seconds', 'until' or 'event' (got {named})"
    if params.get("timeout") is not None and given != ["event"]:
        return "'timeout' goes with 'event' only (a time wait ends at its time)"
    return None


@dataclass(frozen=True)
class Until:
    """What one wait node waits for, its params resolved: `seconds` from when it began, or `until`, or `event`
    within `timeout` seconds of when it began."""

    key: str
    node: str
    seconds: float | None
    until: float | None
    event: str | None
    timeout: float | None

    def due(self, began: float) -> float | None:
        if self.until is not None:
            return self.until
        after = self.seconds if self.event is None else self.timeout
        return None if after is None else began + after


@register(NODE_TYPE)
class WaitNode(Node):
    """Waits for a time or an event, then writes `data` and `event` (an event's), or `until` (a time's)."""

    PARAMS = PARAMS
    check_params = staticmethod(check_params)  # static validation hook (worker/engine/loader.py)

    def prep(self, shared: Any) -> Until:
        node = getattr(shared, "node_id", NODE_TYPE)
        p = {name: spec.get(NODE_TYPE, self.params, name) for name, spec in PARAMS.items()}
        problem = check_params(p)
        if problem:
            raise ValueError(f"wait node '{node}': {problem}")
        seconds = None if p["seconds"] is None else span(p["seconds"])
        timeout = None if p["timeout"] is None else span(p["timeout"])
        return Until(context.current().batch_key(node), node, seconds, instant(p["until"]), p["event"], timeout)

    def exec(self, until: Until) -> dict[str, Any]:
        ctx = context.current()
        waits = ctx.waits if ctx.waits is not None else MemoryWaits()
        due = until.due(waits.begin(until.key, time.time()))
        waiting = Waiting(until.key, until.node, due, until.event)
        while True:
            if until.event is not None:
                released, data = waits.take(until.key, until.event)
                if released:
                    waits.end(until.key)
                    return {"event": until.event, "data": data}
            if due is not None and time.time() >= due:
                waits.end(until.key)
                if until.event is not None:
                    raise EventTimedOut(f"wait node '{until.node}': event '{until.event}' did not come by {clock(due)}")
                return {"until": datetime.fromtimestamp(due, UTC).isoformat()}
            waits.hold(waiting, ctx.cancelled)

    def post(self, shared: Any, prep_res: Until, exec_res: dict[str, Any]) -> str:
        for key, value in exec_res.items():
            shared[key] = value
        return "default"
