"""Schedules, made from a number: the workflow a run is given and the faults it meets, both drawn from
`random.Random(number)`, so one number always gives the same schedule and `make chaos SEED=N` replays it.

Why a `Schedule` value and not the number alone: shrinking (shrink.py) removes faults and features one at a time,
which no number can express, and a kept regression test writes the reduced schedule out as code. The workflow is
built from the schedule's fields by `workflow()`, never stored, so every field a shrink changes is reflected.

The features are those users combine: a batch (`continue` with a failure threshold, or `fail_fast`), `parallel` with
`max_concurrent`, a `rate_limit` key shared between runs, parallel branches with a fan-in, a sub-workflow, an `llm`
node (the loopback provider), a priority, two runs at once, and a dataset job. Every item is a `test-ledger` node
(tests/support/counting_nodes.py): it records each execution's start, end and side effect in Redis.

The kinds of `LATER_FAULTS` (Redis paused, a cancel then `resume`, an `update` of `max_concurrent`) are drawn only for
numbers from `LATER_FROM` on: every earlier number keeps the exact schedule it was run with (tests/RELIABILITY.md), so
`make chaos SEED=N` still replays its verdict. Likewise from `NEWEST_FROM` (501) on: a schedule may run on RabbitMQ
(the `rabbitmq` feature, about one in four: the broker a RabbitMQ node of the campaign's own, the state still in a
redis-server), and draws the kinds of `NEWEST_FAULTS`: `cut_worker` (a worker host's link to Redis down for the hold)
on Redis, `restart_broker` (RabbitMQ's application stopped for the hold) on RabbitMQ only; and a schedule with an
`llm` node may give its workflow a `budget` (half of them: a cap no run reaches, so that the result is still the local
run's, while its reservations go through the faults and must be gone once the run ended). These draws come after
every draw an earlier number makes, and only for numbers from 501 on, so schedules 1-500 are as they were.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

#: Every feature a schedule may combine.
FEATURES = (
    "threshold", "fail_fast", "parallel", "rate_limit", "branches", "subworkflow", "llm", "priority", "two_runs",
    "dataset",
)  # fmt: skip
#: Every fault kind (faults.py injects each).
FAULTS = ("kill_worker", "kill_child", "stop_worker", "stop_child", "restart_redis", "cancel", "kill_client")
#: Fault kinds added after schedules 1-400 were run, drawn from schedule `LATER_FROM` on (faults.py injects each).
LATER_FAULTS = ("pause_redis", "resume", "update")
#: The first schedule number that may draw a kind of `LATER_FAULTS`.
LATER_FROM = 401
#: Fault kinds added after schedules 1-500 were run, drawn from schedule `NEWEST_FROM` on (faults.py injects each).
NEWEST_FAULTS = ("cut_worker", "restart_broker")
#: The first schedule number that may draw the `rabbitmq` feature or a kind of `NEWEST_FAULTS`.
NEWEST_FROM = 501
#: The feature of a schedule run with RabbitMQ as the broker (not in `FEATURES`: drawn apart, from `NEWEST_FROM` on).
RABBITMQ = "rabbitmq"
#: The share of schedules from `NEWEST_FROM` on that run on RabbitMQ.
RABBITMQ_SHARE = 0.25
#: Kinds that need the schedule's broker to be RabbitMQ (a Redis broker is restarted by `restart_redis`).
RABBITMQ_ONLY = ("restart_broker",)
#: Kinds the RabbitMQ-brokered cluster has no target for: its workers are all on this host (the cut of a host on
#: RabbitMQ, its connection dropped after two missed heartbeats, is tests/worker/cluster/test_rabbitmq.py's).
REDIS_ONLY = ("cut_worker",)
#: The feature of a workflow with a `budget` (drawn apart, from `NEWEST_FROM` on, for a schedule with `llm`).
BUDGET = "budget"
#: Its cap: far above what a run bills, so it never stops one (the check is that nothing stays reserved).
BUDGET_TOKENS = 1_000_000
#: Kinds with a length (`Fault.hold`, 0.5-4 s).
HELD = ("stop_worker", "stop_child", "restart_redis", "pause_redis", "cut_worker", "restart_broker")
#: The rate-limit keys schedules share: runs of different schedules draw from the same buckets.
RATE_KEYS = ("chaos-a", "chaos-b")
#: Calls a rate-limit bucket lets go at once after a quiet spell.
BURST = 2


@dataclass(frozen=True)
class Fault:
    """One fault: `kind`, injected once `after` executions of the first run's batch began, lasting `hold` seconds
    (a pause, Redis down) where the kind has a length."""

    kind: str
    after: int
    hold: float = 0.0
    cap: int = 0  # an `update`'s new `max_concurrent`


@dataclass(frozen=True)
class Schedule:
    """One schedule: a workflow (its features and sizes) and the faults it meets, in order."""

    number: int
    features: tuple[str, ...]
    items: int
    chunk_size: int
    seconds: float
    failing: tuple[int, ...] = ()
    max_concurrent: int = 2
    rate: float = 20.0
    rate_key: str = RATE_KEYS[0]
    faults: tuple[Fault, ...] = field(default_factory=tuple)

    def has(self, feature: str) -> bool:
        return feature in self.features

    def without_fault(self, index: int) -> Schedule:
        return replace(self, faults=self.faults[:index] + self.faults[index + 1 :])

    def without_feature(self, feature: str) -> Schedule:
        return replace(self, features=tuple(f for f in self.features if f != feature))

    def describe(self) -> str:
        faults = ", ".join(
            f"{f.kind}@{f.after}" + (f"/{f.hold:g}s" if f.hold else "") + (f"->{f.cap}" if f.cap else "")
            for f in self.faults
        )
        return f"{'+'.join(self.features) or 'batch'} ({self.items} items) | {faults or 'no fault'}"


def generate(number: int) -> Schedule:
    """The schedule of `number`: the same number, the same schedule."""
    rng = random.Random(number)
    features = [f for f in FEATURES if f != "dataset" and rng.random() < 0.3]
    if "fail_fast" in features and "threshold" in features:
        features.remove(rng.choice(["fail_fast", "threshold"]))
    if rng.random() < 0.15:
        features = ["dataset", *[f for f in features if f in ("rate_limit", "priority")]]
    if number >= NEWEST_FROM and rng.random() < RABBITMQ_SHARE:  # no draw below 501: those schedules stay as run
        features.append(RABBITMQ)
    items = rng.randint(8, 30)
    failing: tuple[int, ...] = ()
    if "threshold" in features or "fail_fast" in features:
        failing = tuple(sorted(rng.sample(range(items), rng.randint(1, 3))))
    faults = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        kind = rng.choice(kinds_for(number, features))
        hold = round(rng.uniform(0.5, 4.0), 1) if kind in HELD else 0.0
        cap = rng.randint(1, 3) if kind == "update" else 0
        faults.append(Fault(kind, rng.randint(1, max(1, items // 2)), hold, cap))
    faults.sort(key=lambda fault: fault.after)
    if number >= NEWEST_FROM and "llm" in features and rng.random() < 0.5:  # the last draw: nothing else moves
        features.append(BUDGET)
    return Schedule(
        number=number,
        features=tuple(features),
        items=items,
        chunk_size=rng.randint(2, 6),
        seconds=round(rng.uniform(0.05, 0.3), 2),
        failing=failing,
        max_concurrent=rng.randint(1, 3),
        rate=float(rng.choice((5, 10, 20))),
        rate_key=rng.choice(RATE_KEYS),
        faults=tuple(faults),
    )


def kinds_for(number: int, features: list[str]) -> list[str]:
    """The fault kinds a schedule draws from: `LATER_FAULTS` from `LATER_FROM` on, `NEWEST_FAULTS` from
    `NEWEST_FROM` on; no client to kill, and no `resume` (a dataset job goes on with `redrive`), for a dataset job;
    `update` only with `parallel`; `RABBITMQ_ONLY` kinds only on RabbitMQ, `REDIS_ONLY` ones only on Redis."""
    kinds = list(FAULTS) + (list(LATER_FAULTS) if number >= LATER_FROM else [])
    kinds += list(NEWEST_FAULTS) if number >= NEWEST_FROM else []
    unfit = {"kill_client", "resume"} if "dataset" in features else set()
    if "parallel" not in features:
        unfit.add("update")
    unfit |= set(REDIS_ONLY if RABBITMQ in features else RABBITMQ_ONLY)
    return [kind for kind in kinds if kind not in unfit]


def ledger_item(schedule: Schedule, label: str, fail: Any = False) -> dict[str, Any]:
    """The params of a `test-ledger` node: `label` recorded under the run's ledger key."""
    return {"key": "${ledger}", "label": label, "fail": fail, "seconds": schedule.seconds}


def batch(schedule: Schedule) -> dict[str, Any]:
    """The batch node `b`: one ledger execution per item, with the schedule's batch features."""
    spec: dict[str, Any] = {"items": "${items}", "chunk_size": schedule.chunk_size}
    if schedule.has("threshold"):
        crossed = schedule.number % 2  # an odd schedule's failures cross the threshold: the batch fails
        spec |= {"error_handling": "continue", "tolerated_failure_count": max(0, len(schedule.failing) - crossed)}
    elif schedule.failing:
        spec["error_handling"] = "fail_fast"
    else:
        spec["error_handling"] = "continue"
    if schedule.has("parallel"):
        spec |= {"parallel": True, "max_concurrent": schedule.max_concurrent}
    node: dict[str, Any] = {"id": "b", "type": "test-ledger", "batch": spec}
    node["params"] = ledger_item(schedule, "${item.label}", "${item.fail}")
    if schedule.has("rate_limit"):
        node["rate_limit"] = {"key": schedule.rate_key, "requests_per_second": schedule.rate, "burst": BURST}
    return node


def workflow(schedule: Schedule) -> dict[str, Any]:
    """The workflow of a schedule: `b`, then (with their features) branches `x`, `y` meeting at `join`, a
    sub-workflow `sub` (a small batch of its own), and an `llm` node `ask`, in that order."""
    if schedule.has("dataset"):
        record = {
            "id": "r",
            "type": "test-ledger",
            "params": ledger_item(schedule, "${record.label}", "${record.fail}"),
        }
        if schedule.has("rate_limit"):
            record["rate_limit"] = {"key": schedule.rate_key, "requests_per_second": schedule.rate, "burst": BURST}
        wf: dict[str, Any] = {"nodes": [record]}
        if schedule.has("priority"):
            wf["priority"] = "high" if schedule.number % 2 else "low"
        return wf
    nodes: list[dict[str, Any]] = [batch(schedule)]
    edges: list[dict[str, Any]] = []
    last = "b"
    if schedule.has("branches"):
        nodes += [{"id": name, "type": "test-ledger", "params": ledger_item(schedule, name)} for name in ("x", "y")]
        nodes.append({"id": "join", "type": "echo", "params": {"x": "${x.label}", "y": "${y.label}"}})
        edges += [{"from": "b", "to": name, "parallel": True, "fan_in": "join"} for name in ("x", "y")]
        edges += [{"from": "x", "to": "join"}, {"from": "y", "to": "join"}]
        last = "join"
    if schedule.has("subworkflow"):
        inner = {"id": "s", "type": "test-ledger", "params": {**ledger_item(schedule, "${item}"), "key": "${ledger}"}}
        inner["batch"] = {"items": "${labels}"}
        sub = {"inputs": {"ledger": {}, "labels": {}}, "nodes": [inner]}
        labels = [f"s:{i}" for i in range(3)]
        params = {"workflow": sub, "inputs": {"ledger": "${ledger}", "labels": labels}}
        nodes.append({"id": "sub", "type": "workflow", "params": params})
        edges.append({"from": last, "to": "sub"})
        last = "sub"
    if schedule.has("llm"):
        nodes.append({"id": "ask", "type": "llm", "params": {"prompt": "count ${b.count}", "model": "openai/gpt-test"}})
        edges.append({"from": last, "to": "ask"})
    wf = {"nodes": nodes}
    if edges:
        wf["edges"] = edges
    if schedule.has("priority"):
        wf["priority"] = "high" if schedule.number % 2 else "low"
    if schedule.has(BUDGET):
        wf["budget"] = {"tokens": BUDGET_TOKENS}
    return wf


def items(schedule: Schedule) -> list[dict[str, Any]]:
    """The batch's items (or the dataset job's records): a label each, and whether it fails on purpose."""
    return [{"label": f"b:{i}", "fail": i in schedule.failing} for i in range(schedule.items)]


def inputs(schedule: Schedule, ledger: str) -> dict[str, Any]:
    """A run's inputs: its ledger key (each run its own) and, but for a dataset job, the items."""
    return {"ledger": ledger} if schedule.has("dataset") else {"ledger": ledger, "items": items(schedule)}
