"""The workers the cluster's queued work can keep busy: `chordflow_desired_pool_slots` and
`chordflow_desired_workers`, what KEDA scales the workers on (deploy/k8s/keda.yaml).

The queue's length is the wrong signal for rate-limited work: 50 workers against a 200 requests/s limit only wait
at the bucket. So the demand is counted in pool slots (a chunk runs on one pool process), run by run, and capped by
what the limits let run at once:

- a queued run, or a running one between batches (an advance running its nodes, a merge): 1 slot; a run waiting
  in a `wait` node: none;
- an open batch: its chunks in flight (claimed: queued or running) plus those its blocks left to do make, as
  batch_window.lua claims them (about CHORDFLOW_CHUNK_SECONDS of the measured time per item, at most the plan's
  largest chunk); with `max_concurrent` N (the run's `update` override first) at most ceil(N / threads), threads
  being a chunk's (1, or a parallel batch's max_concurrent, default 8);
- a rate limit: the batches behind one key (shared by every run) together keep at most rate x t items in flight,
  t the seconds an admitted call runs as the workers measure it into the bucket (`call_us`, a moving average:
  worker/cluster/rate_limits.py), ASSUMED_CALL_SECONDS before any call was measured. A limit of tokens only caps
  nothing here (what a call costs in tokens is not known before it ends);
- a dataset job: its chunks in flight and stored, at least 1 while it runs (its records are read as chunks finish;
  not capped by rate limits: a record runs the whole workflow, not one call);
- at least 1 while a wait's timer (or a signal) or a schedule is due within WAKE_AHEAD_SECONDS: a worker's sweep
  fires them, so a cluster scaled to zero wakes for them.

Workers = ceil(slots / a worker's pool slots), the registered workers' mean pool size (none registered: the
`--worker-slots` of `chordflow metrics`). A scrape reads a few commands per active run, per open batch and per
rate-limit key, in five pipelines; never one per item.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from worker.batch.executor import DEFAULT_THREADS
from worker.cluster.state.keys import SCHEDULES_DUE, TIMERS, RunKeys, limit_key

#: Seconds an admitted call is assumed to run while its bucket has measured none: a model call's order of size.
ASSUMED_CALL_SECONDS = 1.0
MICROS = 1_000_000
#: A wait's timer or a schedule due this soon asks for a worker (KEDA's polling and a pod's start take about this).
WAKE_AHEAD_SECONDS = 60.0
#: The window's plan fields read per batch (worker/cluster/state/lua/batch_window.lua).
PLAN_FIELDS = ("id", "ended", "error", "max_items", "min_items", "chunk_seconds", "items", "seconds")


@dataclass(frozen=True)
class Limits:
    """What caps a batch node's slots, from its workflow: threads per chunk, `max_concurrent`, its rate limit."""

    parallel: bool = False
    max_concurrent: int | None = None
    rate_key: str | None = None
    per_second: float | None = None  # None: no request rate (no rate limit, or one of tokens only)


@dataclass(frozen=True)
class Desired:
    """Pool slots the queued work can keep busy, and the workers they make."""

    slots: int = 0
    workers: int = 0


@dataclass
class _Batch:
    chunks: int
    threads: int
    limits: Limits


def batch_limits(workflow: Mapping[str, Any]) -> dict[str, Limits]:
    """The limits of each batch node of a workflow (its JSON as recorded), by node id."""
    found = {}
    for node in workflow.get("nodes") or []:
        batch = node.get("batch") if isinstance(node, dict) else None
        if not isinstance(batch, dict):
            continue
        limit = node.get("rate_limit") or {}
        per_minute = limit.get("requests_per_minute")
        per_second = limit.get("requests_per_second") or (per_minute / 60 if per_minute else None)
        found[str(node.get("id"))] = Limits(
            bool(batch.get("parallel")), batch.get("max_concurrent"), limit.get("key"), per_second
        )
    return found


def desired(
    client: redis.Redis,
    runs: list[Any],
    limits: Mapping[str, dict[str, Limits]],
    pool_sizes: Mapping[str, int],
    worker_slots: int,
) -> Desired:
    """What the active runs (metrics.RunView: run_id, status, dataset, waiting) ask for; `limits`: each run's batch
    nodes' (`batch_limits`); `pool_sizes`: the worker registry; `worker_slots`: a worker's slots if none is in it."""
    slots = 0
    running = [v for v in runs if v.status == "running" and v.waiting is None]
    slots += sum(1 for v in runs if v.status == "queued")
    pipe = client.pipeline(transaction=False)
    for view in running:
        keys = RunKeys(view.run_id)
        if view.dataset:
            pipe.scard(keys.dataset.pending)
            pipe.llen(keys.dataset.todo)
        else:
            pipe.hkeys(keys.totals)
            pipe.hget(keys.overrides, "max_concurrent")
    replies = pipe.execute() if running else []
    open_batches: list[tuple[str, str, int | None]] = []  # (run, batch, max_concurrent override)
    for position, view in enumerate(running):
        first, second = replies[2 * position], replies[2 * position + 1]
        if view.dataset:
            slots += max(1, int(first) + int(second))
            continue
        override = int(second) if second is not None else None
        named = [key.decode() for key in first]
        open_batches += [(view.run_id, b, override) for b in named if b.split("#", 1)[0] in limits.get(view.run_id, {})]
    found = _open(client, open_batches, limits)
    between = {v.run_id for v in running if not v.dataset} - {run for run, _ in found}
    slots += len(between) + _capped(client, list(found.values()))
    if not slots and _due(client):
        slots = 1
    return Desired(slots, _workers(slots, pool_sizes, worker_slots))


def _due(client: redis.Redis) -> bool:
    """Whether a wait's timer or a schedule is due within WAKE_AHEAD_SECONDS (worker/cluster/waits.py, schedules.py)."""
    soon = time.time() + WAKE_AHEAD_SECONDS
    pipe = client.pipeline(transaction=False)
    for key in (TIMERS, SCHEDULES_DUE):
        pipe.zcount(key, "-inf", soon)
    return any(pipe.execute())


def _open(
    client: redis.Redis, candidates: list[tuple[str, str, int | None]], limits: Mapping[str, dict[str, Limits]]
) -> dict[tuple[str, str], _Batch]:
    """The batches among `candidates` whose window is open (planned, not ended), each with its chunks to run."""
    pipe = client.pipeline(transaction=False)
    for run_id, batch, _ in candidates:
        pipe.hmget(RunKeys(run_id).window(batch).plan, PLAN_FIELDS)
    plans = pipe.execute() if candidates else []
    going = [(c, p) for c, p in zip(candidates, plans, strict=True) if p[0] is not None and not p[1] and not p[2]]
    pipe = client.pipeline(transaction=False)
    for (run_id, batch, _), _plan in going:
        window = RunKeys(run_id).window(batch)
        pipe.lrange(window.todo, 0, -1)
        pipe.hlen(window.pending)
    replies = pipe.execute() if going else []
    found = {}
    for position, ((run_id, batch, override), plan) in enumerate(going):
        spec = limits[run_id][batch.split("#", 1)[0]]
        max_items, min_items, chunk_seconds, measured, seconds = (float(v or 0) for v in plan[3:])
        blocks = [block.decode().split(":") for block in replies[2 * position]]
        todo = sum(int(end) - int(start) for start, end in blocks)
        per_chunk = max_items
        if measured > 0 and seconds > 0:  # as batch_window.lua sizes its claims
            per_chunk = min(max_items, max(min_items, math.ceil(chunk_seconds * measured / seconds)))
        to_do = min(len(blocks), math.ceil(todo / max(1.0, per_chunk)))
        concurrent = override or spec.max_concurrent
        threads = max(1, min(concurrent or DEFAULT_THREADS, int(max_items))) if spec.parallel else 1
        limited = Limits(spec.parallel, concurrent, spec.rate_key, spec.per_second)
        found[(run_id, batch)] = _Batch(int(replies[2 * position + 1]) + to_do, threads, limited)
    return found


def _capped(client: redis.Redis, batches: list[_Batch]) -> int:
    """The batches' slots: each capped by its `max_concurrent`, those behind one rate-limit key together by the
    items in flight its rate keeps busy."""
    by_key: dict[str, list[tuple[_Batch, int]]] = {}
    total = 0
    for batch in batches:
        slots = batch.chunks
        if batch.limits.max_concurrent:
            slots = min(slots, math.ceil(batch.limits.max_concurrent / batch.threads))
        if batch.limits.rate_key and batch.limits.per_second:
            by_key.setdefault(batch.limits.rate_key, []).append((batch, slots))
        else:
            total += slots
    keys = sorted(by_key)
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hget(limit_key(key), "call_us")
    for key, call_us in zip(keys, pipe.execute() if keys else [], strict=True):
        group = by_key[key]
        call = int(call_us) / MICROS if call_us is not None else ASSUMED_CALL_SECONDS
        rate = min(b.limits.per_second or 0.0 for b, _ in group)  # two declarations of a key share the lowest
        cap = max(1, math.ceil(rate * call / min(b.threads for b, _ in group)))
        total += min(cap, sum(slots for _, slots in group))
    return total


def _workers(slots: int, pool_sizes: Mapping[str, int], worker_slots: int) -> int:
    """Workers that give `slots` pool slots: the registered workers' mean pool size each, else `worker_slots`."""
    per_worker = sum(pool_sizes.values()) / len(pool_sizes) if pool_sizes else worker_slots
    return math.ceil(slots / max(per_worker, 1))
