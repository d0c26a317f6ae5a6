"""Schedules: a workflow run on the cluster at every time a cron expression names, by the workers themselves (no
beat process, nothing of this process needed once it is added): `add`, `list_schedules`, `remove`, `pause`, `resume`
(public as `scheduler.schedule`, `list_schedules`, `unschedule`, `pause_schedule`, `resume_schedule`).

`add` does here everything a submit checks (scheduler/durable.py): the workflow loaded and validated with this
process's node types, its inputs applied, its first store built and encoded as a run's store is kept. What it stores
in Redis is that prepared template, signed with the cluster's key (worker/cluster/state/schedules.py), from which a
worker makes each fire's run without importing `scheduler` (worker/cluster/schedules.py). A bad name, cron, timezone,
catchup, priority, workflow or input is one ValidationError before anything is written.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from ir import snapshot
from ir.errors import UnknownSchedule, ValidationError
from ir.priorities import PRIORITIES
from scheduler.inputs import apply_inputs
from scheduler.reach import broker_errors, preflight
from worker import settings
from worker.cluster import signing
from worker.cluster.app import current_app
from worker.cluster.schedules import CATCHUPS, Cron, redis_now
from worker.cluster.state.runstate import client
from worker.cluster.state.schedules import Schedule, Schedules
from worker.engine.loader import load, source_of
from worker.llm import usage

__all__ = ["add", "list_schedules", "pause", "remove", "resume"]

#: A schedule's name: what `list`, `pause`, `resume` and `remove` take, and part of each fire's idempotency key.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
NAME_RULE = "1 to 100 letters, digits, '_', '.' or '-', starting with a letter or digit"


def add(
    name: str,
    workflow: Any,
    cron: str,
    *,
    timezone: str = "UTC",
    inputs: dict[str, Any] | None = None,
    catchup: str = "last",
    priority: str | None = None,
) -> dict[str, Any]:
    """Run `workflow` with `inputs` on the cluster at every time `cron` names in `timezone`, until removed; a schedule
    of the same name is replaced (its fires already made are not made again). Returns the schedule as
    `list_schedules` shows it, plus `replaced` (whether one was).

    `cron`: 5 fields (minute hour day month weekday), 6 with seconds first (`*/10 * * * * *`), or @hourly, @daily...
    `catchup`: what the fires missed while no worker ran become: none, the latest one (`last`) or each one (`all`, at
    most 100). `priority`: high, normal or low (None: the workflow's `priority` field, else normal).
    """
    check_name(name)
    if catchup not in CATCHUPS:
        raise ValidationError(f"catchup {catchup!r}: expected one of {', '.join(CATCHUPS)}")
    if priority is not None and priority not in PRIORITIES:
        raise ValidationError(f"priority {priority!r}: expected one of {', '.join(PRIORITIES)}")
    parsed = Cron(cron, timezone)
    wf = load(workflow, list(inputs or {}))  # what the runs are given is a known input
    store: dict[str, Any] = {}
    apply_inputs(wf, store, inputs)
    usage.start_list(wf, store)
    encoded = {key: snapshot.encode(value, label=key) for key, value in store.items()}
    signer = signing.publishing_signer(current_app())  # no key: nothing is written, as for a submit
    with _schedules() as schedules:
        now = redis_now(schedules.redis)
        made = Schedule(
            name, uuid.uuid4().hex, cron, timezone, catchup, wf.wire(), encoded, wf.start_id(), source_of(workflow),
            priority or wf.priority or "normal", now,
        )  # fmt: skip
        if signer is not None:  # what a worker will read back, signed
            made.signature = signer.sign_schedule(Schedule.unpack(made.pack()).spec())
        first = parsed.after(now)
        replaced = schedules.put(made, first)
        return {**shown(made, first), "replaced": replaced is not None}


def list_schedules() -> list[dict[str, Any]]:
    """Every schedule, by name: its cron, timezone, catchup, whether paused, its next fire (epoch seconds, and as
    ISO 8601 in its timezone and in UTC; None while paused), its last fire and the run it made."""
    with _schedules() as schedules:
        return [shown(each, next_fire) for each, next_fire in schedules.listed()]


def remove(name: str) -> None:
    """Delete a schedule: it makes no more runs (its runs are left as they are). UnknownSchedule if there is none."""
    with _schedules() as schedules:
        if not schedules.remove(name):
            raise UnknownSchedule(name)


def pause(name: str) -> dict[str, Any]:
    """No run until `resume` (the fires meanwhile are skipped, whatever the catchup); returns the schedule."""
    with _schedules() as schedules:
        found = schedules.pause(name)
        if found is None:
            raise UnknownSchedule(name)
        return shown(found, None)


def resume(name: str) -> dict[str, Any]:
    """Fire again from the first time after now; returns the schedule, with its next fire."""
    with _schedules() as schedules:
        now = redis_now(schedules.redis)
        found = schedules.resume(name, lambda each: Cron(each.cron, each.timezone).after(now))
        if found is None:
            raise UnknownSchedule(name)
        return shown(found, Cron(found.cron, found.timezone).after(now))


def check_name(name: Any) -> None:
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        shown_name = repr(name) if len(str(name)) <= 100 else f"({len(str(name))} characters)"
        raise ValidationError(f"schedule name {shown_name}: expected {NAME_RULE}")


def shown(schedule: Schedule, next_fire: int | None) -> dict[str, Any]:
    """A schedule as `list_schedules` (and `chordflow schedule list --json`) gives it."""
    zone = ZoneInfo(schedule.timezone)
    return {
        "name": schedule.name,
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "catchup": schedule.catchup,
        "paused": schedule.paused,
        "priority": schedule.priority,
        "workflow": str(schedule.workflow.get("name") or schedule.source or "workflow"),
        "next_fire": next_fire,
        "next_fire_local": _iso(next_fire, zone),
        "next_fire_utc": _iso(next_fire, ZoneInfo("UTC")),
        "last_fire": schedule.last_fire,
        "last_run": schedule.last_run,
        "created": schedule.created,
    }


def _iso(when: int | None, zone: ZoneInfo) -> str | None:
    return None if when is None else datetime.fromtimestamp(when, zone).isoformat()


@contextlib.contextmanager
def _schedules() -> Iterator[Schedules]:
    """The cluster's schedules, its Redis reached first (one line if it cannot be), a lost connection one line too."""
    s = settings.load()
    preflight(s)
    with broker_errors(s.result_backend):
        yield Schedules(client())
