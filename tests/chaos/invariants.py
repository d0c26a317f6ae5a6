"""What must hold after every schedule, whatever the faults: why a module of its own? The checks are the campaign's
contract, read apart from how the faults were made; each returns violations as one line each, naming the schedule
number to replay (`make chaos SEED=N`), and none raises, so one schedule reports every violation it found.

- The result: equal to the local backend's run of the same workflow and inputs, or the run failed or was cancelled
  with an error that names the fault (a cancel, the client's process gone) or the workflow's own failure; never a
  success with another result.
- Outcomes: every batch index and dataset record exactly once; every side effect at most once per execution that
  began (the ledger: `effects` <= `runs` per label), and at least once for an item the result says succeeded.
  A resumed run (cancelled, then `resume`d) answers to the same: it must end as the local run did, unless a later
  cancel stopped it again.
- Limits: `max_concurrent` never exceeded (measured from the ledger's spans). After an `update` of it, the highest
  of the caps in force holds throughout, and the new cap alone from `SETTLE` seconds after the update was
  acknowledged (items already running under the old cap finish; permits follow within about a second).
- Nothing leaks once a run ended: no live permit, lease, queued message, budget reservation or open timer of it;
  a rate-limit bucket holds no reservation beyond its burst. (The probe of a second run's concurrency is the
  runner's: it needs a run.)
- Purge: no key of the run is left, but its tombstone.
"""

from __future__ import annotations

import collections
import json
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from tests.chaos.generator import BURST, Schedule
from worker.cluster.state import keys

#: Words an error names a fault by: a cancel, the client's process gone, the workflow's own failures.
FAULT_WORDS = ("cancel", "gone", "fails on purpose", "tolerated", "failed items", "threshold")
#: Seconds after an acknowledged `update` from which its new `max_concurrent` alone must hold (the bound
#: tests/scheduler/test_run_updates.py holds the engine to).
SETTLE = 5.0


@dataclass
class Outcome:
    """How one run ended: status, error, and what to compare (a run's store, or a dataset job's rows)."""

    status: str
    error: str | None = None
    value: Any = None


@dataclass
class Observed:
    """One run of a schedule on the cluster, as the runner saw it."""

    run_id: str
    ledger: str
    outcome: Outcome
    reference: Outcome
    cancelled: bool = False
    client_killed: bool = False
    resumed: bool = False
    caps: list[tuple[float, int]] = field(default_factory=list)  # each `update` acknowledged: (wall clock, cap)
    ended_at: float = 0.0  # wall clock
    notes: list[str] = field(default_factory=list)


def comparable(shared: dict[str, Any]) -> str:
    """A store as compared: every key but the run's own ledger key, as sorted JSON."""
    return json.dumps({k: v for k, v in shared.items() if k != "ledger"}, sort_keys=True, default=str)


def line(schedule: Schedule, what: str, detail: str) -> str:
    return f"schedule {schedule.number}: {what}: {detail} (replay: make chaos SEED={schedule.number})"


def result(schedule: Schedule, seen: Observed) -> list[str]:
    """The result equals the local run's, or the run ended with an error naming a fault or the workflow's failure."""
    got, ref = seen.outcome, seen.reference
    if got.status == "success":
        if ref.status != "success":
            return [line(schedule, "result", f"succeeded where the local run {ref.status}: {ref.error}")]
        if got.value != ref.value:
            return [line(schedule, "result", f"differs from the local run's: {got.value[:300]} != {ref.value[:300]}")]
        return []
    if got.status == "cancelled":
        return [] if seen.cancelled else [line(schedule, "result", "cancelled, but no cancel was issued")]
    if got.status == "failed":
        error = got.error or ""
        if ref.status == "failed" or any(word in error for word in FAULT_WORDS):
            if ref.status == "success" and not (seen.cancelled or seen.client_killed):
                return [line(schedule, "result", f"failed where the local run succeeded: {error[:200]}")]
            return []
        return [line(schedule, "result", f"failed with an error naming no fault: {error[:200]}")]
    return [line(schedule, "result", f"ended {got.status!r}: {got.error}")]


def ledger(r: redis.Redis, seen: Observed) -> tuple[dict[str, int], dict[str, int], list[tuple[str, float, float]]]:
    """The run's ledger: executions begun per label, side effects per label, and spans (label, start, end). Each
    execution counts once by its token (tests/support/counting_nodes.py), however often a retry wrote it."""
    starts = {entry.split()[3]: entry.split()[0] for entry in map(bytes.decode, r.lrange(f"{seen.ledger}:runs", 0, -1))}
    runs = dict(collections.Counter(starts.values()))
    effects = dict(collections.Counter(v.decode() for v in r.hvals(f"{seen.ledger}:effects")))
    spans = []
    for entry in r.hvals(f"{seen.ledger}:spans"):
        label, began, ended = entry.decode().split()
        spans.append((label, float(began), float(ended)))
    return runs, effects, spans


def outcomes(schedule: Schedule, seen: Observed, r: redis.Redis) -> list[str]:
    """Each index once in the result; side effects at most once per execution begun, at least once per success."""
    found = []
    runs, effects, _ = ledger(r, seen)
    for label, count in effects.items():
        if count > runs.get(label, 0):
            found.append(line(schedule, "side effects", f"{label}: {count} effects from {runs.get(label, 0)} starts"))
    value = seen.outcome.value
    if seen.outcome.status != "success" or value is None:
        return found
    if schedule.has("dataset"):
        rows = json.loads(value)
        if [row["index"] for row in rows] != list(range(schedule.items)):
            found.append(line(schedule, "outcomes", f"record rows {[row['index'] for row in rows]}"))
        labels = [f"b:{row['index']}" for row in rows if row.get("error") is None]
    else:
        b = json.loads(value)["b"]
        if b["count"] != schedule.items or len(b["results"]) != schedule.items:
            found.append(line(schedule, "outcomes", f"{len(b['results'])} results, count {b['count']}"))
        labels = [f"b:{i}" for i, res in enumerate(b["results"]) if res is not None]
    missing = [label for label in labels if effects.get(label, 0) < 1]
    if missing:
        found.append(line(schedule, "side effects", f"succeeded without a side effect: {missing}"))
    return found


def concurrency(spans: list[tuple[str, float, float]], prefix: str = "b:", since: float = 0.0) -> int:
    """The most spans of labels starting with `prefix` open at once, from wall-clock `since` on."""
    edges = sorted([(max(s, since), 1) for label, s, e in spans if label.startswith(prefix) and e > since]
                   + [(e, -1) for label, _, e in spans if label.startswith(prefix) and e > since])  # fmt: skip
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def limits(schedule: Schedule, seen: Observed, r: redis.Redis) -> list[str]:
    """`max_concurrent` never exceeded by the batch's executions (a killed execution has no span: not counted)."""
    if not schedule.has("parallel"):
        return []
    spans = ledger(r, seen)[2]
    highest = max([schedule.max_concurrent, *(cap for _, cap in seen.caps)])
    most = concurrency(spans)
    found = []
    if most > highest:
        found.append(line(schedule, "max_concurrent", f"{most} items at once, limit {highest}"))
    for at, cap in seen.caps[-1:]:  # the last update's cap, once it settled
        most = concurrency(spans, since=at + SETTLE)
        if most > cap:
            detail = f"{most} items at once {SETTLE:g} s after an update to {cap}"
            found.append(line(schedule, "max_concurrent", detail))
    return found


def held(r: redis.Redis, run_id: str) -> dict[str, str]:
    """What a run that ended still holds in Redis: live permits, leases, queued messages, budget reservations,
    timers, aging's entry. Key -> what it holds."""
    run, now = keys.RunKeys(run_id), time.time()
    found: dict[str, str] = {}
    for key in r.scan_iter(match=f"{run.prefix}*", count=1000):
        name = key.decode()
        if name.startswith(run.permits("")):
            live = r.zrangebyscore(key, now, "+inf")
            if live:
                found[name] = f"{len(live)} live permit(s)"
        elif name == run.lease or name.startswith(run.lease + ":"):
            found[name] = f"lease, ttl {r.ttl(key)} s"
        elif name in (run.queued, run.queued_messages):
            found[name] = f"{r.type(key).decode()} of queued messages"
        elif name == run.budget:
            budget = {k.decode(): v.decode() for k, v in r.hgetall(key).items()}
            reserved = {k: v for k, v in budget.items() if k.startswith("reserved") and float(v)}
            if reserved:
                found[name] = f"budget reserved {reserved}"
    if r.zscore(keys.QUEUED, run_id) is not None:
        found[keys.QUEUED] = "the run is listed as having queued messages"
    timers = [m for m, _ in r.zscan_iter(keys.TIMERS, match=f"{run_id}|*")]
    if timers:
        found[keys.TIMERS] = f"{len(timers)} timer(s)"
    return found


def rate_reserved(r: redis.Redis, key: str) -> float:
    """Seconds a rate-limit bucket is reserved ahead of now beyond its burst (0: nothing held past the burst)."""
    tat, iv = r.hmget(keys.limit_key(key), "tat", "iv")
    if tat is None:
        return 0.0
    seconds, micros = r.time()
    now = seconds * 1_000_000 + micros
    return max(0.0, (int(tat) - now - BURST * int(iv or 0)) / 1_000_000)


def purged(r: redis.Redis, run_id: str) -> list[str]:
    """The keys of a purged run still in Redis (its tombstone is not under its prefix)."""
    left = [k.decode() for k in r.scan_iter(match=f"{keys.run_prefix(run_id)}*", count=1000)]
    if r.zscore(keys.RUNS, run_id) is not None:
        left.append(keys.RUNS)
    return left
