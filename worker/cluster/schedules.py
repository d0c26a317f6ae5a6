"""Schedules: runs made at the times a cron expression names, by the workers themselves: no beat process to keep
alive, and no fire made twice however many workers there are.

Every worker keeps a `ScheduleSweeper`; at most one sweep starts per SWEEP_SECONDS across the cluster (a key SET NX).
A sweep takes each active schedule whose next fire time has come (worker/cluster/state/schedules.py), works out which
fires to make (`due_fires`: those of the last GRACE_SECONDS always; older ones, missed while no worker swept, as the
schedule's catchup says) and makes each one's run as `submit` would: the idempotency claim `schedule:<name>:<fire>`
(worker/cluster/state/idempotency.py) first, then the run's record (queued, the template's workflow and store, signed
with this worker's key) and its first advance. Then the schedule's next fire time becomes the first one after now.
The claim is what makes each fire one run: two sweeps that overlap, a sweep done again because the one before died
between a run and the next fire time, a schedule replaced under the same name all find the fire claimed. Time is
Redis's (TIME), one clock for every worker.

A worker makes no run of a template that does not carry the signature of a key holder (worker/cluster/signing.py):
Redis is data, and whoever can write it must not choose what the workers run.

Cron expressions are croniter's: 5 fields (minute hour day month weekday), or 6 with seconds FIRST (`*/10 * * * * *`:
every 10 s), or a keyword (@hourly, @daily...), read in the schedule's timezone (zoneinfo). A time the clocks skip
fires when they jump (croniter); when they go back, a time of day that comes twice fires once, while a schedule with
`*` in its minute or hour fires by the clock as it goes (as Vixie cron does).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from datetime import datetime
from typing import Any, NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import redis
from croniter import CroniterBadDateError, CroniterError, croniter

from ir.errors import NewerFormat, ValidationError
from worker.cluster import priorities, sending, signing
from worker.cluster.messages import Advance
from worker.cluster.state import idempotency
from worker.cluster.state.keys import SCHEDULE_SWEEP
from worker.cluster.state.runs import ClusterRuns
from worker.cluster.state.schedules import Schedule, Schedules
from worker.periodic import Periodic
from worker.runs.record import RunRecord, new_run_id

log = logging.getLogger(__name__)

#: What a schedule does with the fires it missed while no worker swept (older than GRACE_SECONDS when first seen):
#: none skips them, last makes the latest of them, all makes each one (at most MAX_CATCHUP).
CATCHUPS = ("none", "last", "all")
#: Seconds between two sweeps: a fire makes its run within about this long.
SWEEP_SECONDS = 1.0
#: A fire at most this old when a sweep first sees it is due now, whatever the catchup (two sweeps and a bit).
GRACE_SECONDS = 2 * SWEEP_SECONDS + 3
#: Missed fires made at most, for a schedule whose catchup is `all` (the latest ones; the older are skipped, logged).
MAX_CATCHUP = 100
#: Schedules fired per sweep, at most (the most overdue first); the rest at the next sweep.
PER_SWEEP = 100
#: The cron keywords croniter reads, as the fields they stand for (their minute and hour tell DST apart).
KEYWORDS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}  # fmt: skip
#: How a cron expression is written, for the error of a bad one.
CRON_RULE = (
    "5 fields (minute hour day-of-month month day-of-week), 6 with seconds first (`*/10 * * * * *`), or @hourly, "
    "@daily, @weekly, @monthly, @yearly"
)


class Cron:
    """A cron expression read in a timezone; ValidationError (one line naming `cron` or `timezone`) for a bad one."""

    def __init__(self, expression: str, timezone: str = "UTC"):
        self.expression = expression
        text = KEYWORDS.get(expression.strip().lower(), expression.strip())
        fields = text.split()
        if len(fields) not in (5, 6):
            what = "an unknown keyword" if text.startswith("@") else f"{len(fields)} fields"
            raise ValidationError(f"cron {expression!r}: {what}; expected {CRON_RULE}")
        self.zone = zone(timezone)
        self.text, self.seconds = text, len(fields) == 6
        minute, hour = fields[-5], fields[-4]
        self.time_of_day = "*" not in minute and "*" not in hour  # fires once on a day the clocks go back
        try:
            self.after(0)
        except CroniterBadDateError:
            raise ValidationError(f"cron {expression!r}: never fires (no such date)") from None
        except (CroniterError, ValueError, KeyError, TypeError) as exc:
            raise ValidationError(f"cron {expression!r}: {exc}; expected {CRON_RULE}") from None

    def after(self, at: float) -> int:
        """The first fire time (epoch seconds) after `at`."""
        return next(self._fires(at, backwards=False))

    def back_from(self, at: float) -> Iterator[int]:
        """The fire times at or before `at`, latest first."""
        return self._fires(at, backwards=True)

    def _fires(self, at: float, backwards: bool) -> Iterator[int]:
        start = datetime.fromtimestamp(math.floor(at) + (1 if backwards else 0), self.zone)
        found = croniter(self.text, start, second_at_beginning=self.seconds)
        step = found.get_prev if backwards else found.get_next
        while True:
            when = step(datetime)
            if not (self.time_of_day and repeated(when)):
                yield int(when.timestamp())


def zone(name: str) -> ZoneInfo:
    """The timezone named so (IANA: UTC, Europe/Berlin...); ValidationError naming `timezone` for an unknown one."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ValidationError(f"timezone {name!r}: unknown (an IANA name, like UTC or Europe/Berlin)") from None


def repeated(when: datetime) -> bool:
    """Whether `when` is the second time its wall-clock time comes, the day the clocks go back."""
    first = when.replace(tzinfo=None).replace(tzinfo=when.tzinfo, fold=0)
    return first.timestamp() < when.timestamp()


class Due(NamedTuple):
    """What a sweep makes of a schedule: its fires to make, oldest first; whether missed fires were skipped
    (catchup none or last), and whether `all` was capped at MAX_CATCHUP."""

    fires: list[int]
    skipped: bool
    capped: bool


def due_fires(cron: Cron, catchup: str, next_fire: int, now: float) -> Due:
    """The fires of a schedule to make at `now`, the first not yet made being `next_fire`: every fire of the last
    GRACE_SECONDS, and of the older ones (missed while no worker swept): none, the latest (`last`, only when no
    recent one stands for it) or each (`all`, the latest MAX_CATCHUP)."""
    fires: list[int] = []
    skipped = capped = False
    for fire in cron.back_from(now):
        if fire < next_fire:
            break
        missed = fire < now - GRACE_SECONDS
        if missed and (catchup == "none" or (catchup == "last" and fires)):
            skipped = True
            break
        if len(fires) == MAX_CATCHUP:
            capped = True
            break
        fires.append(fire)
        if missed and catchup == "last":  # the latest missed fire stands for the older ones
            skipped = next(cron.back_from(fire - 1)) >= next_fire
            break
    return Due(fires[::-1], skipped, capped)


def fire_key(name: str, fire: int) -> str:
    """The idempotency key of a schedule's fire: the one run it makes."""
    return f"schedule:{name}:{fire}"


def sweep(app: Any, now: float | None = None) -> int:
    """Make the runs of every due schedule; returns how many were made."""
    schedules = Schedules(sending.client(app))
    now = redis_now(schedules.redis) if now is None else now
    made = 0
    for name, next_fire in schedules.due(now, PER_SWEEP):
        try:
            made += fire(app, schedules, name, next_fire, now)
        except NewerFormat as exc:  # a newer release's template: a worker of that release fires it
            _warn_once(name, f"{exc}; left to a worker of a newer release")
        except Exception as exc:  # Redis or the broker away, a run not recorded: the next sweep tries this one again
            log.warning("schedule %r: could not fire: %s: %s", name, type(exc).__name__, exc)
    return made


def fire(app: Any, schedules: Schedules, name: str, next_fire: int, now: float) -> int:
    """Make the runs of one due schedule and set its next fire time; returns how many runs were made."""
    schedule = schedules.get(name)
    if schedule is None or schedule.paused:  # removed or paused between the two reads: its entry goes
        schedules.forget(name)
        return 0
    if not signing.schedule_verified(app.signer, schedule.spec(), schedule.signature):
        log.warning("schedule %r: its template in Redis does not match its signature (altered?): no run made, and "
                    "it fires no more until added again", name)  # fmt: skip
        schedules.drop_due(name)
        return 0
    cron = Cron(schedule.cron, schedule.timezone)
    due = due_fires(cron, schedule.catchup, next_fire, now)
    if due.capped:
        log.warning("schedule %r: more than %d fires missed: the latest %d made, the older skipped (catchup all)",
                    name, MAX_CATCHUP, MAX_CATCHUP)  # fmt: skip
    elif due.skipped:
        log.info("schedule %r: fires missed since %s skipped (catchup %s)", name, _iso(next_fire), schedule.catchup)
    made, last = 0, None
    for when in due.fires:
        run_id, new = make_run(app, schedule, when)
        made += new
        last = (when, run_id)
        if new:
            log.info("schedule %r: run %s for its fire at %s", name, run_id, _iso(when))
    schedules.fired(schedule, last, cron.after(now))
    return made


def make_run(app: Any, schedule: Schedule, when: int) -> tuple[str, bool]:
    """The run of `schedule`'s fire at `when`: (its id, whether this call made it). One claim decides which call
    makes it; the others get its id."""
    client = sending.client(app)
    runs = ClusterRuns(client, app.chordflow_settings.run_ttl, signer=app.signer)
    key, run_id = fire_key(schedule.name, when), new_run_id()
    held = idempotency.claim(client, key, run_id, schedule.version, runs.ttl, lambda r: runs.get(r) is not None)
    if held is not None:
        found = runs.get(held[0])
        if found is not None and found.status == "queued" and found.step == 0:
            # Recorded by a sweep that may have died before sending its advance: a second advance is fenced.
            sending.send(app, Advance(held[0], 0), priority=schedule.priority, kind=priorities.CONTROL)
        return held[0], False
    record = RunRecord(run_id, schedule.workflow, "celery", "queued", schedule.start, source=schedule.source)
    record.priority = schedule.priority
    try:
        runs.create(record, {}, encoded=schedule.store)
    except BaseException:
        with contextlib.suppress(Exception):
            idempotency.release(client, key, run_id)
        raise
    try:
        sending.send(app, Advance(run_id, 0), priority=schedule.priority, kind=priorities.CONTROL)
    except Exception as exc:  # recorded but never enqueued: the record says so (the fire keeps this run)
        with contextlib.suppress(Exception):
            runs.set_status(run_id, "failed", f"not enqueued: {exc}")
        raise
    return run_id, True


def redis_now(client: redis.Redis) -> float:
    """Now by Redis's clock: every worker and client reads the same time."""
    seconds, micros = client.time()
    return seconds + micros / 1e6


def _iso(when: float) -> str:
    return datetime.fromtimestamp(when).astimezone().isoformat(timespec="seconds")


_warned: set[str] = set()


def _warn_once(name: str, text: str) -> None:
    if name not in _warned:
        _warned.add(name)
        log.warning("schedule %r: %s", name, text)


class ScheduleSweeper(Periodic):
    """A worker's schedule sweeps, every SWEEP_SECONDS, until `stop()`; at most one sweep of the cluster starts per
    interval (two that overlap make each fire's run once: the claim)."""

    name = "chordflow-schedules"

    def __init__(self, app: Any):
        super().__init__(SWEEP_SECONDS)
        self.app = app

    def tick(self) -> None:
        try:
            if sending.client(self.app).set(SCHEDULE_SWEEP, 1, nx=True, px=int(self.interval * 1000)):
                with self.app.backend.quiet():  # nobody waits on an advance's Celery result
                    sweep(self.app)
        except Exception as exc:  # Redis or the broker away for a moment: the next sweep tries again
            log.warning("could not fire due schedules: %s", exc)
