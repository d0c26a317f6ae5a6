"""One schedule, run: why a module of its own? It is the only part that knows the order of things — the local
reference run, the cluster runs started, each fault injected once the ledger shows its moment, the wait for the end
with a bound, every invariant, the probe of a second run's concurrency, the purge — and times each step, so the
campaign's lines (and the report) give the recovery times: permits back, rate bucket back, run done after the
last fault.

A `Campaign` owns the cluster (faults.py `chaos_cluster`) and the loopback model provider for all the schedules it
runs; `check(schedule)` returns a `Verdict`. Nothing here sleeps to synchronize: every wait polls a condition (the
ledger's length, a run's record, what a run holds in Redis) with a bound.

Two parts are made on the first schedule that needs them and kept to the campaign's end (faults.py says why): the
far host of `cut_worker` (its worker `n1` runs only during the schedules that draw the kind: `check` starts it before
the runs and stops it after; one that ended on its own meanwhile is a violation), and the cluster on RabbitMQ of the
schedules with the `rabbitmq` feature (`use` points this process at the schedule's cluster). A `cut_worker` waits
(polled, up to `BUSY_WITHIN` s) for `n1` to be inside an item before it cuts, so that the cut lands mid-execution
when `n1` has any work.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import redis

import scheduler
from ir.errors import BackendError, UnknownRun, ValidationError
from scheduler import api
from scheduler.datasets import reading
from scheduler.localcluster import Cluster
from scheduler.lookup import find_run
from tests.chaos import generator, invariants
from tests.chaos.faults import FAR, Far, Injector, chaos_cluster, far_side, rabbitmq_cluster
from tests.chaos.generator import RABBITMQ, Schedule
from tests.chaos.invariants import Observed, Outcome
from tests.support import counting_nodes, llm_server, rabbitmq
from worker.runs.record import FINAL

#: A run must end within this many seconds of its last fault's end (of its start, with none).
END_BOUND = 120.0
#: What a run holds in Redis (a killed holder's permit, lease) must be gone within this many seconds of its end.
HOLD_BOUND = 25.0
#: The probe run must have `max_concurrent` items running within this many seconds of its first start.
FULL_AT_ONCE = 1.5
#: A `cut_worker` waits up to this many seconds for `n1` to be inside an item (else it cuts `n1` idle).
BUSY_WITHIN = 5.0
T = TypeVar("T")
#: A client driving a run in its own process (`scheduler.run(backend="celery")`): prints `run <id>`, then runs it.
CLIENT = """import json, sys
import scheduler
wf, given, run_id = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
print("run", run_id, file=sys.stderr, flush=True)
scheduler.run(wf, given, backend="celery", run_id=run_id)
"""
LEDGER_NODE = counting_nodes.LedgerNode  # `test-ledger`, registered in this process too (the local runs)


def retrying(call: Callable[[], T], seconds: float = 90.0) -> T:
    """`call()`, again while Redis is out of reach (a restart fault), for up to `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return call()
        except (redis.ConnectionError, redis.TimeoutError, OSError, BackendError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)  # a reconnect's pace, not a synchronization


@dataclass
class Verdict:
    """What one schedule gave: its violations (empty: it passed) and the times measured (seconds)."""

    schedule: Schedule
    violations: list[str] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    times: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def line(self) -> str:
        times = " ".join(f"{k}={v:.1f}s" for k, v in self.times.items())
        verdict = "ok" if not self.violations else f"FAIL ({len(self.violations)})"
        return (f"schedule {self.schedule.number}: {self.schedule.describe()} | runs {','.join(self.statuses)} | "
                f"{verdict} | {times} | {self.seconds:.1f}s")  # fmt: skip


@dataclass
class Run:
    """A run of the schedule on the cluster: its id, ledger key, the client process driving it (if one does)."""

    run_id: str
    ledger: str
    client: subprocess.Popen | None = None


class Campaign:
    """The cluster and the model provider, shared by every schedule `check` runs."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self._stack = contextlib.ExitStack()
        self.provider = self._stack.enter_context(llm_server.serving())
        provider_env = llm_server.environment(self.provider)
        added = {**provider_env, "CHORDFLOW_HOME": os.environ.get("CHORDFLOW_HOME") or str(workdir / "home")}
        self._previous = {name: os.environ.get(name) for name in added}
        os.environ.update(added)
        self.provider_env = provider_env
        self.on_redis = self._stack.enter_context(chaos_cluster(workdir, provider_env))
        self.cluster = self.on_redis  # the cluster of the schedule being checked (`use`)
        self.redis = redis.Redis.from_url(self.cluster.redis.url)
        self.far: Far | None = None  # made by `far_host`, on the first schedule with a `cut_worker`
        self.on_rabbitmq: tuple[Cluster, rabbitmq.Node] | None = None  # made by `use`, on the first `rabbitmq` one

    def use(self, schedule: Schedule) -> Cluster:
        """Point this process (and `cluster`, `redis`) at the cluster `schedule` runs on: the RabbitMQ-brokered one
        for the `rabbitmq` feature (made now if this is the first), else the Redis one."""
        cluster = self.on_redis
        if schedule.has(RABBITMQ):
            if self.on_rabbitmq is None:
                made = rabbitmq_cluster(self.workdir / "on-rabbitmq", self.provider_env)
                self.on_rabbitmq = self._stack.enter_context(made)
            cluster = self.on_rabbitmq[0]
        if cluster is not self.cluster:
            self.redis.close()
            self.cluster, self.redis = cluster, redis.Redis.from_url(cluster.redis.url)
        cluster.apply_env()  # the campaign's end restores what was there before (chaos_cluster)
        return cluster

    def far_host(self) -> Far:
        """The far host of `cut_worker` on the Redis-brokered cluster, made the first time."""
        if self.far is None:
            self.far = self._stack.enter_context(far_side(self.on_redis, self.provider.url))
        return self.far

    def injector(self, stop_runs: Any, client: Any = None, **given: Any) -> Injector:
        """An Injector of the current schedule's cluster, with its far worker (if one runs) and its RabbitMQ node
        (if it runs on RabbitMQ)."""
        far = self.far if self.far is not None and self.far.worker is not None else None
        broker = self.on_rabbitmq[1] if self.on_rabbitmq and self.cluster is self.on_rabbitmq[0] else None
        return Injector(self.cluster, stop_runs, client, far=far, broker=broker, **given)

    def close(self) -> None:
        self._stack.close()
        for name, value in self._previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    # -- runs ---------------------------------------------------------------------------------------------------

    def reference(self, schedule: Schedule) -> Outcome:
        """The local backend's run of the same workflow and inputs."""
        run_id, ledger = f"ref{uuid.uuid4().hex[:10]}", f"chaos:ref:{uuid.uuid4().hex[:8]}"
        wf = generator.workflow(schedule)
        with contextlib.suppress(Exception):  # a failed run raises its error; its record says it
            if schedule.has("dataset"):
                records = generator.items(schedule)
                scheduler.run(wf, {"ledger": ledger}, items=records, backend="local", run_id=run_id, as_="record")
            else:
                scheduler.run(wf, generator.inputs(schedule, ledger), backend="local", run_id=run_id)
        return self.outcome(schedule, run_id)

    def outcome(self, schedule: Schedule, run_id: str) -> Outcome:
        record, runs = retrying(lambda: find_run(run_id))
        status = "success" if record.status == "succeeded" else record.status
        if schedule.has("dataset"):
            rows = retrying(lambda: list(reading.rows(record, is_final=lambda: True)))
            return Outcome(status, record.error, json.dumps(rows, sort_keys=True, default=str))
        return Outcome(status, record.error, invariants.comparable(retrying(lambda: runs.load_store(run_id))))

    def start(self, schedule: Schedule, client: bool) -> Run:
        """Start one run on the cluster: submitted, or driven by a `chordflow run --backend celery` process."""
        ledger = f"chaos:{schedule.number}:{uuid.uuid4().hex[:8]}"
        wf = generator.workflow(schedule)
        if schedule.has("dataset"):
            records = generator.items(schedule)
            run_id = scheduler.submit(
                wf, {"ledger": ledger}, items=records, as_="record", chunk_size=schedule.chunk_size
            )
            return Run(run_id, ledger)
        if not client:
            return Run(scheduler.submit(wf, generator.inputs(schedule, ledger)), ledger)
        path = self.workdir / f"wf-{schedule.number}.json"
        path.write_text(json.dumps(wf))
        if schedule.number % 2:  # `chordflow run --backend celery`: submit, then wait (the client is the waiter)
            argv = [sys.executable, "-m", "scheduler.cli", "run", str(path), "--backend", "celery"]
            argv += ["--input", f"ledger={ledger}", "--input", f"items={json.dumps(generator.items(schedule))}"]
        else:  # `scheduler.run(backend="celery")`: the client drives the run, its batches on the workers
            run_id = f"cl{uuid.uuid4().hex[:10]}"
            given = self.workdir / f"inputs-{schedule.number}.json"
            given.write_text(json.dumps(generator.inputs(schedule, ledger)))
            argv = [sys.executable, "-c", CLIENT, str(path), str(given), run_id]
        env = {**os.environ, "CHORDFLOW_PLUGINS": self.cluster.env["CHORDFLOW_PLUGINS"]}
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        first = proc.stderr.readline()  # type: ignore[union-attr]  # "run <id> (cancel with: ...)"
        assert first.startswith("run "), first + proc.stderr.read()  # type: ignore[union-attr]
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # type: ignore[union-attr]
        return Run(first.split()[1], ledger, proc)

    def status(self, run_id: str) -> str:
        try:
            return find_run(run_id)[0].status
        except (redis.ConnectionError, redis.TimeoutError, OSError, BackendError, UnknownRun):  # not yet recorded
            return "unknown"

    def ended(self, runs: list[Run]) -> bool:
        return all(self.status(run.run_id) in FINAL for run in runs)

    def started(self, run: Run) -> int:
        try:
            return int(self.redis.llen(f"{run.ledger}:runs"))
        except (redis.ConnectionError, redis.TimeoutError):
            return 0

    def until(self, condition: Callable[[], bool], seconds: float) -> float | None:
        """Seconds until `condition()` held (polled), or None if it did not within `seconds`."""
        began = time.monotonic()
        while not condition():
            if time.monotonic() - began > seconds:
                return None
            time.sleep(0.05)
        return time.monotonic() - began

    # -- a schedule ---------------------------------------------------------------------------------------------

    def check(self, schedule: Schedule) -> Verdict:
        """Run `schedule` and check every invariant; an exception of the campaign's own is a violation too. The
        schedule's time leaves out making its cluster ready (the RabbitMQ side or the far host the first time)."""
        began = time.monotonic()
        verdict = Verdict(schedule)
        far = None
        try:
            self.use(schedule)
            if any(f.kind == "cut_worker" for f in schedule.faults) and not schedule.has(RABBITMQ):
                far = self.far_host()
                far.start(str(schedule.number))
            began = time.monotonic()
            self.steps(schedule, verdict)
        except Exception as exc:  # reported as the schedule's violation, with its replay number
            verdict.violations.append(invariants.line(schedule, "error", f"{type(exc).__name__}: {exc}"[:500]))
            with contextlib.suppress(Exception):  # a settle failing too (a cluster never made) is said above
                self.injector(list).settle()
        finally:
            if far is not None and far.worker is not None:
                ended = far.stop()
                if ended is not None:
                    detail = f"{FAR} (on the far host) exited with code {ended} during the schedule"
                    verdict.violations.append(invariants.line(schedule, "worker", detail))
        verdict.seconds = time.monotonic() - began
        return verdict

    def steps(self, schedule: Schedule, verdict: Verdict) -> None:
        reference = self.reference(schedule)
        kinds = [fault.kind for fault in schedule.faults]
        runs = [self.start(schedule, client="kill_client" in kinds)]
        if schedule.has("two_runs"):
            runs.append(self.start(schedule, client=False))
        stops: dict[str, str] = {}  # run id -> its last stop: "cancelled", or "resumed" after it
        caps: dict[str, list[tuple[float, int]]] = {}  # run id -> each `update` acknowledged: (wall clock, cap)

        def stop_runs() -> None:
            cancel_live(runs)
            stops.update({run.run_id: "cancelled" for run in runs})

        injector = self.injector(
            stop_runs, runs[0].client,
            resume_runs=lambda: self.resume_runs(runs, stops),
            update_runs=lambda cap: self.update_runs(runs, cap, caps),
        )  # fmt: skip
        for fault in schedule.faults:
            reached = self.until(lambda f=fault: self.started(runs[0]) >= f.after or self.ended(runs), 60)
            if reached is None or self.ended(runs):
                verdict.faults.append(f"{fault.kind}: not reached")
                continue
            where = self.cut_moment(injector.far, runs) if fault.kind == "cut_worker" else ""
            if where is None:
                verdict.faults.append(f"{fault.kind}: not reached (the runs ended before {FAR} had an item)")
                continue
            done = injector.inject(fault)
            verdict.faults.append(f"{fault.kind} -> {done.target or '-'}{where}")
        injector.settle()
        last_fault = max((d.ended or d.began for d in injector.done), default=time.monotonic())
        took = self.until(lambda: self.ended(runs), END_BOUND)
        if took is None:
            verdict.violations.append(invariants.line(schedule, "bound", f"runs still not ended {END_BOUND:g} s after "
                                                      "the last fault"))  # fmt: skip
            with contextlib.suppress(Exception):
                cancel_live(runs)
            self.until(lambda: self.ended(runs), 60)
        verdict.times["done_after_fault"] = time.monotonic() - last_fault
        ended_at = time.monotonic()
        observed = []
        for run in runs:
            if run.client is not None and run.client.poll() is None:
                run.client.wait(timeout=60)
            cancelled = stops[run.run_id] == "cancelled" if run.run_id in stops else "cancel" in kinds
            seen = Observed(run.run_id, run.ledger, self.outcome(schedule, run.run_id), reference,
                            cancelled=cancelled, client_killed=run.client is not None,
                            resumed=stops.get(run.run_id) == "resumed", caps=caps.get(run.run_id, []))  # fmt: skip
            verdict.statuses.append(seen.outcome.status)
            observed.append(seen)
            verdict.violations += invariants.result(schedule, seen)
            verdict.violations += retrying(lambda s=seen: invariants.outcomes(schedule, s, self.redis))
            verdict.violations += retrying(lambda s=seen: invariants.limits(schedule, s, self.redis))
        verdict.violations += self.leaks(schedule, runs, ended_at, verdict)
        verdict.violations += self.probe(schedule, verdict)
        for run in runs:
            verdict.violations += self.purge(schedule, run)

    def cut_moment(self, far: Far | None, runs: list[Run]) -> str | None:
        """Wait (polled, up to BUSY_WITHIN s) for the far worker to be inside an item of the runs; says which it
        was, for the fault's line; None if the runs ended meanwhile (nothing left to cut off)."""
        if far is None:
            return ""
        ledgers = [run.ledger for run in runs]
        busy = self.until(lambda: self.ended(runs) or retrying(lambda: far.busy(ledgers, self.redis)), BUSY_WITHIN)
        if self.ended(runs):
            return None
        return " (mid-execution)" if busy is not None else " (idle)"

    def resume_runs(self, runs: list[Run], stops: dict[str, str]) -> list[str]:
        """The `resume` fault: cancel the runs still going, wait (polled, bounded) for each to end, then resume each
        submitted run that ended cancelled. Returns the ids resumed."""
        retrying(lambda: cancel_live(runs))
        stops.update({run.run_id: "cancelled" for run in runs})
        if self.until(lambda: self.ended(runs), 90) is None:
            raise AssertionError(f"resume: runs not ended 90 s after their cancel: {[r.run_id for r in runs]}")
        resumed = []
        for run in runs:
            if run.client is None and self.status(run.run_id) == "cancelled":
                retrying(lambda run=run: api.resume_cluster(run.run_id))
                stops[run.run_id] = "resumed"
                resumed.append(run.run_id)
        return resumed

    def update_runs(self, runs: list[Run], cap: int, caps: dict[str, list[tuple[float, int]]]) -> list[str]:
        """The `update` fault: `max_concurrent` set to `cap` on each submitted run still going; a run that ended
        meanwhile refuses it ("already ended"), which is its right. Returns the ids acknowledged."""
        updated = []
        for run in runs:
            if run.client is not None:
                continue
            try:
                retrying(lambda run=run: api.update(run.run_id, max_concurrent=cap))
            except ValidationError as exc:
                if "already ended" not in str(exc):
                    raise
                continue
            caps.setdefault(run.run_id, []).append((time.time(), cap))
            updated.append(run.run_id)
        return updated

    def leaks(self, schedule: Schedule, runs: list[Run], ended_at: float, verdict: Verdict) -> list[str]:
        """Nothing held by a run once it ended (within HOLD_BOUND: a killed holder's lease runs out); the rate
        bucket holds nothing past its burst."""
        found = []
        for run in runs:
            held: dict[str, str] = {}

            def clear(run: Run = run, held: dict[str, str] = held) -> bool:
                held.clear()
                held.update(retrying(lambda: invariants.held(self.redis, run.run_id)))
                return not held

            took = self.until(clear, HOLD_BOUND)
            if took is None:
                found.append(invariants.line(schedule, "leak", f"run {run.run_id} still holds {held} "
                                             f"{HOLD_BOUND:g} s after it ended"))  # fmt: skip
            verdict.times["held_back"] = max(verdict.times.get("held_back", 0.0), time.monotonic() - ended_at)
        if schedule.has("rate_limit"):
            took = self.until(lambda: invariants.rate_reserved(self.redis, schedule.rate_key) == 0, HOLD_BOUND)
            if took is None:
                ahead = invariants.rate_reserved(self.redis, schedule.rate_key)
                found.append(invariants.line(schedule, "leak", f"rate bucket {schedule.rate_key} reserved {ahead:.1f} "
                                             "s past its burst"))  # fmt: skip
            verdict.times["rate_back"] = time.monotonic() - ended_at
        return found

    def probe(self, schedule: Schedule, verdict: Verdict) -> list[str]:
        """A second run with the same limit keys reaches its full concurrency at once (from its ledger's spans)."""
        if not (schedule.has("parallel") or schedule.has("rate_limit")) or schedule.has("dataset"):
            return []
        features = tuple(f for f in schedule.features if f in ("parallel", "rate_limit"))
        width = schedule.max_concurrent if schedule.has("parallel") else 1
        probe = replace(schedule, features=features, items=2 * width + 2, seconds=0.6, failing=(), faults=(),
                        chunk_size=max(schedule.chunk_size, width))  # fmt: skip
        if schedule.has("rate_limit") and width > 2:  # burst 2: the rest come at the bucket's rate
            probe = replace(probe, rate=max(probe.rate, 10.0))
        run = self.start(probe, client=False)
        try:
            result = scheduler.wait(run.run_id, timeout=60)
        except Exception as exc:  # the probe's own failure is the violation
            return [invariants.line(schedule, "probe", f"the probe run raised {type(exc).__name__}: {exc}"[:300])]
        spans = invariants.ledger(self.redis, Observed(run.run_id, run.ledger, Outcome(result.status), Outcome("")))[2]
        api.purge(run.run_id)
        if not spans:
            return [invariants.line(schedule, "probe", f"the probe run {result.status} with no item: {result.error}")]
        first = min(s for _, s, _ in spans)
        starts = sorted(s for _, s, _ in spans)
        full = starts[width - 1] - first  # the moment the width-th item began
        verdict.times["probe_full"] = full
        most = invariants.concurrency(spans)
        found = []
        if most < width or full > FULL_AT_ONCE:
            found.append(invariants.line(schedule, "probe", f"a second run reached {most} of {width} at once, the "
                                         f"{width}th item {full:.2f} s after the first"))  # fmt: skip
        return found

    def purge(self, schedule: Schedule, run: Run) -> list[str]:
        try:
            api.purge(run.run_id)
        except Exception as exc:  # a refusal is the violation
            return [invariants.line(schedule, "purge", f"run {run.run_id}: {type(exc).__name__}: {exc}")]
        left = retrying(lambda: invariants.purged(self.redis, run.run_id))
        return [invariants.line(schedule, "purge", f"run {run.run_id} left {left}")] if left else []


@contextlib.contextmanager
def campaign(workdir: Path) -> Iterator[Campaign]:
    made = Campaign(workdir)
    try:
        yield made
    finally:
        made.close()


def cancel_live(runs: list[Any]) -> None:
    """`cancel` each run still going: one that ended meanwhile (a fail_fast batch, the other run of two) refuses a
    cancel with "already ended", which is its right, not the fault's failure."""
    for run in runs:
        try:
            api.cancel(run.run_id)
        except ValidationError as exc:
            if "already ended" not in str(exc):
                raise
