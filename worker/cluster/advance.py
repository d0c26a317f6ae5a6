"""`chordflow.advance`: the cluster's stepper. A submitted run lives in Redis and advances through it.

Each advance loads the run's checkpoint and runs nodes until the flow ends or a batch node dispatches
its chunks; the merge task merges them and enqueues the next advance. No task waits on another.
Fencing: one lease per run (renewed while the task runs, so it outlives no dead worker) keeps two advances
from running at once, and an advance goes on from the run's checkpoint, never from its own step: an advance
behind the run (a duplicate, or one redelivered after its worker was SIGKILLed between two nodes it had
checkpointed) picks the run up where it stands — where a dispatched batch or branch's mark stops it again,
or where the dead worker stopped. So redelivery after a SIGKILL and duplicated messages are harmless.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import astuple, dataclass
from typing import Any

from celery.exceptions import Ignore

from ir import snapshot
from ir.branches import Section
from ir.errors import Fenced, RunCancelled
from worker import redact, tracing
from worker.batch import overrides
from worker.batch.aggregate import BatchResult, merge
from worker.batch.backend import BatchJob
from worker.batch.remote import rebuild, stored_batch_result
from worker.cluster import logs, outage, signing
from worker.cluster.app import task
from worker.cluster.batches.dispatch import dispatch_batch, redispatch, send_advance
from worker.cluster.messages import ADVANCE, ADVANCE_BRANCH, Advance, AdvanceBranch
from worker.cluster.state import budget as budgets
from worker.cluster.state.answers import RedisAnswers
from worker.cluster.state.keys import RunKeys
from worker.cluster.state.runs import ClusterRuns
from worker.cluster.state.runstate import RunState
from worker.cluster.state.waits import RedisWaits, waiting
from worker.engine import context
from worker.engine.context import RunContext
from worker.engine.flow import WorkflowFlow, build_flow
from worker.engine.loader import load
from worker.engine.sections import BranchSink, BranchState, BranchSteps, StopFlag, StoredBranches, merged
from worker.engine.stepper import batch_nodes, drive, ending
from worker.engine.steps import Cursor, Step, Suspended
from worker.nodes import provider_batches
from worker.runs.record import FINAL, RECORD_STATUS, StepJournal

log = logging.getLogger(__name__)
#: Seconds a run's lease lasts without renewal (the holder renews it every third of that).
LEASE_SECONDS = 15


@dataclass
class Ending:
    """How a stretch of driving a run (or a branch) ended: `done` (its `value`), `dispatched` (a batch or the
    branches went out: Suspended), `cancelled` (RunCancelled) or `failed` (`error`, any other exception). The one
    ladder of both advances: a Fenced one raises Ignore (the delivery that took over owns the run: no result, no
    done mark), an outage goes up (not the run's failure: the task gives its message back, outage.py)."""

    state: str
    value: Any = None
    error: Exception | None = None

    @classmethod
    def of(cls, body: Callable[[], Any]) -> Ending:
        try:
            return cls("done", body())
        except Suspended:
            return cls("dispatched")
        except Fenced as exc:  # paused past the lease
            log.warning("%s", exc)
            raise Ignore() from None
        except RunCancelled:
            return cls("cancelled")
        except outage.ERRORS:
            raise
        except Exception as exc:
            return cls("failed", error=exc)


class Lease:
    """One advance at a time per run: a Redis key with a TTL, renewed by a thread while held."""

    def __init__(self, runs: ClusterRuns, name: str):
        """`name`: the run's `lease` key, or a branch's (keys.py RunKeys)."""
        self.redis, self.name, self.token = runs.redis, name, uuid.uuid4().hex
        self.stop = threading.Event()

    def acquire(self) -> bool:
        if not self.redis.set(self.name, self.token, nx=True, ex=LEASE_SECONDS):
            return False
        threading.Thread(target=self._renew, daemon=True, name="chordflow-lease").start()
        return True

    def _renew(self) -> None:
        while not self.stop.wait(LEASE_SECONDS / 3):
            if self.redis.get(self.name) == self.token.encode():
                self.redis.expire(self.name, LEASE_SECONDS)

    def release(self) -> None:
        self.stop.set()
        if self.redis.get(self.name) == self.token.encode():
            self.redis.delete(self.name)

    def check(self) -> None:
        """Fenced unless this lease is still ours (one GET, once per step)."""
        if self.redis.get(self.name) != self.token.encode():
            raise Fenced(f"{self.name}: the lease was taken over by another worker; stopping")


class ClusterBatches:
    """The backend inside an advance: a batch's stored result when its chunks have been merged, else dispatch
    chunks for the items without an outcome and suspend."""

    name = "celery"

    def __init__(
        self, run_id: str, ctx: RunContext, runs: ClusterRuns, state: RunState, branch: tuple[str, str] | None = None
    ):
        self.run_id, self.ctx, self.runs, self.state = run_id, ctx, runs, state
        self.branch = branch  # (section key, branch): a branch's batch continues that branch's cursor

    def run_batch(self, job: BatchJob) -> BatchResult:
        if not job.items:
            return merge([], 0, job.batch.fail_fast)
        stored = self.state.batch_result(job.key)
        if stored is not None:
            return stored_batch_result(stored)
        # Planned here the first time, or when the advance that marked it dispatched died before planning it;
        # planned but maybe never sent (that advance died after), its chunks in flight go again (redispatch).
        if self.state.mark_dispatched(job.key) or not redispatch(job, self.run_id):
            job.done = [c for c in self.runs.saved_chunks(self.run_id, job.key) if not c.failures]
            # The next advance starts at this batch node's step (not this advance's first step: nodes
            # before it in this advance were checkpointed, and the step fence must let it through).
            priority = self.runs.priority(self.run_id)
            dispatch_batch(job, self.run_id, advance_step=self.ctx.step, branch=self.branch, priority=priority)
        raise Suspended


@task(name=ADVANCE, bind=True, max_retries=None, acks_late=True, ignore_result=True)
def advance(self: Any, message: Any, *legacy: Any) -> str:
    """Advance the run from its step until the flow ends or a batch is dispatched."""
    run_id, step = astuple(Advance.from_wire(message, *legacy))
    runs = ClusterRuns()
    record = runs.get(run_id)
    if record is None or record.status in FINAL or record.step < step:
        return "fenced"
    record.check_format()
    lease = Lease(runs, RunKeys(run_id).lease)
    if not lease.acquire():
        raise self.retry(countdown=LEASE_SECONDS / 3)
    record = runs.get(run_id)  # again, under the lease: the holder before us may have moved the run on
    if record is None or record.status in FINAL or record.step < step:
        lease.release()
        return "fenced"
    state = RunState(run_id)
    ctx = RunContext(answers=RedisAnswers(state))

    def run() -> str:
        if state.cancelled():
            if (held := waiting(state.redis, run_id)) is not None:  # it waited for provider batches: they go too
                provider_batches.cancel_listed(held.batches)
            runs.set_status(run_id, "cancelled", "run cancelled")
            _ended(runs, run_id, record.status, "cancelled", record.node)
            return "cancelled"
        signing.check_run(self.app.signer, run_id, record)  # an altered workflow fails the run: nothing of it runs
        flow = _flow(record.workflow, state.overrides())
        ctx.budget = budgets.record_caps(state, flow.workflow.budget)  # the caps every worker's calls reserve against
        store = runs.load_store(run_id)
        ctx.backend = ClusterBatches(run_id, ctx, runs, state)
        ctx.cancelled = StopFlag(state.cancelled)  # the run's cancel flag in Redis, read between nodes
        ctx.waits = RedisWaits(state)  # a wait not yet due records its timer and ends this advance
        ctx.sections = ClusterSections(run_id, runs, state)
        runs.set_status(run_id, "running", node=record.node)
        if record.status != "running":
            logs.transition(run_id, record.status, "running", node=record.node, steps=record.step)
        journal = StepJournal(runs, run_id, batch_nodes(flow))
        with context.using(ctx):
            cursor = drive(flow, Cursor(record.node, record.step), store, ctx, journal)
        status, error, _ = ending(flow, cursor, store, ctx.last_node)
        runs.set_status(run_id, RECORD_STATUS[status], error, ctx.last_node if error else None)
        _ended(runs, run_id, "running", RECORD_STATUS[status], ctx.last_node, error)
        return RECORD_STATUS[status]

    try:
        with tracing.within(run_id, tracing.parent_of(record.trace)):
            how = Ending.of(run)
            if how.state == "cancelled":
                runs.set_status(run_id, "cancelled", "run cancelled", ctx.last_node)
                _ended(runs, run_id, "running", "cancelled", ctx.last_node)
            elif how.state == "failed":
                runs.set_exception(run_id, how.error)  # first: `wait` re-raises it as soon as it sees the status
                error = redact.mask(f"{type(how.error).__name__}: {how.error}")
                runs.set_status(run_id, "failed", error, ctx.last_node)
                _ended(runs, run_id, "running", "failed", ctx.last_node, error)
        return how.value or how.state
    finally:
        lease.release()


def _ended(runs: ClusterRuns, run_id: str, before: str, after: str, node: str | None, error: str | None = None) -> None:
    """The run's transition line, with its steps and the item counts of its finished batches."""
    record = runs.get(run_id)
    items, failed = logs.batch_items(record.batches if record else None)
    steps = record.step if record else None
    logs.transition(run_id, before, after, node=node, steps=steps, items=items, failed=failed, error=error)


# -- parallel sections: each branch is a cursor of its own ------------------------------------------------------


class ClusterSections:
    """A parallel section of a cluster run. The first time the run's cursor reaches it, each branch becomes a
    cursor of its own, advanced by `chordflow.advance_branch` tasks (its batches dispatch their own chords),
    and this advance ends. The last branch to finish (an atomic join in Redis) enqueues the run's advance at
    the section again, which finds every branch ended and merges them — or, fail_fast, fails the run."""

    def __init__(self, run_id: str, runs: ClusterRuns, state: RunState):
        self.run_id, self.runs, self.state = run_id, runs, state

    def run(self, flow: Any, section: Section, store: dict[str, Any], ctx: RunContext) -> Step:
        key = ctx.batch_key(section.node_id)
        saved = StoredBranches(self.runs, self.run_id).load(key)
        states = [saved.get(b) or BranchState(b, b, ctx.step) for b in section.branches]
        if self.state.mark_dispatched(key):  # the first time here, or a resume: start every unfinished branch
            todo = [s for s in states if not s.finished]
            for branch in todo:
                branch.status, branch.error, branch.kind = "running", None, None
                self.runs.save_branch(self.run_id, key, branch.branch, _encoded(branch))
            self.runs.reset_join(self.run_id, key, [s.branch for s in states if s.finished])
            for branch in todo:
                send_advance(AdvanceBranch(self.run_id, key, branch.branch, branch.step))
            log.info("run %s: section %s -> %d branches", self.run_id, section.node_id, len(todo))
            raise Suspended
        if any(s.status == "running" for s in states):  # a duplicate advance while the branches run
            raise Suspended
        if any(s.status == "cancelled" for s in states) and self.state.cancelled():
            raise RunCancelled("run cancelled")
        failed = [s for s in states if s.status in ("failed", "cancelled")]
        if section.fail_fast and failed:
            first = next((s for s in failed if s.kind), failed[0])
            raise rebuild(*first.kind) if first.kind else RuntimeError(f"branch '{first.branch}': {first.error}")
        return merged(section, states)


def _encoded(state: BranchState) -> bytes:
    return snapshot.encode(state.to_wire(), label=f"branch '{state.branch}'")


@task(name=ADVANCE_BRANCH, bind=True, max_retries=None, acks_late=True, ignore_result=True)
def advance_branch(self: Any, message: Any, *legacy: Any) -> str:
    """Advance one branch of a parallel section from its step until it reaches the fan-in (then join), fails,
    or dispatches a batch (whose merge task enqueues this task again). Like `advance`, it goes on from the
    branch's checkpoint: a redelivered task picks the branch up where it stands."""
    run_id, key, branch, step = astuple(AdvanceBranch.from_wire(message, *legacy))
    runs = ClusterRuns()
    record = runs.get(run_id)
    state = _branch_state(runs, run_id, key, branch)
    if record is None or record.status in FINAL or state is None or state.step < step:
        return "fenced"
    record.check_format()
    try:
        signing.check_run(self.app.signer, run_id, record)  # the one read of the record this task uses
    except signing.WorkflowAltered as exc:
        runs.set_exception(run_id, exc)
        error = f"{type(exc).__name__}: {exc}"
        runs.set_status(run_id, "failed", error)
        _ended(runs, run_id, record.status, "failed", None, error)
        return "refused"
    if state.status != "running":  # it ended, and this is a redelivery: join again (a duplicate joins once)
        _join(runs, run_id, key, branch, len(_section(record.workflow, key).branches))
        return "joined"
    lease = Lease(runs, RunKeys(run_id).branch_lease(key, branch))
    if not lease.acquire():
        raise self.retry(countdown=LEASE_SECONDS / 3)
    rstate = RunState(run_id)
    try:
        state = _branch_state(runs, run_id, key, branch)
        if state is None or state.step < step:
            return "fenced"
        if state.status != "running":  # it ended while this task waited for the lease
            _join(runs, run_id, key, branch, len(_section(record.workflow, key).branches))
            return "joined"
        flow = _flow(record.workflow, RunState(run_id).overrides())
        section = _section(record.workflow, key, flow)
        store = runs.load_store(run_id)
        for name in state.deleted:
            store.pop(name, None)
        store.update(state.changed)
        sink = BranchSink(lambda event: rstate.publish_branch_event(event), branch)
        # A branch stops when the run is cancelled or (fail_fast) another branch of its section failed.
        ctx = RunContext(sink=sink, cancelled=StopFlag(lambda: rstate.should_stop(key)), answers=RedisAnswers(rstate))
        ctx.budget = budgets.in_redis(rstate)
        ctx.backend = ClusterBatches(run_id, ctx, runs, rstate, branch=(key, branch))

        def save(kept: BranchState) -> None:
            lease.check()  # a branch paused past its lease was taken over: it writes nothing more
            runs.save_branch(run_id, key, branch, _encoded(kept))

        journal = BranchSteps(state, save)

        def run() -> Cursor:
            with context.using(ctx), tracing.within(run_id, tracing.parent_of(record.trace)):
                return drive(flow, Cursor(state.node, state.step), store, ctx, journal, section.fan_in.__eq__)

        how = Ending.of(run)
        if how.state == "dispatched":
            return "dispatched"
        if how.state == "done":
            state.status, state.node = "done", how.value.node
        elif how.state == "cancelled":
            state.status = "cancelled"
        else:
            kind, exc = type(how.error), how.error
            state.status, state.kind = "failed", [kind.__module__, kind.__name__, redact.mask(str(exc))]
            state.error = redact.mask(f"{kind.__name__}: {exc}")
            if not sink.erred:
                sink({"type": "error", "node": ctx.last_node, "error": state.error})
            if section.fail_fast:
                rstate.abort(key)
        try:
            save(state)
        except Fenced as exc:
            log.warning("%s", exc)
            raise Ignore() from None
        rstate.publish_branch_event({"type": "branch_complete", "branch": branch, "ok": state.status == "done"})
        _join(runs, run_id, key, branch, len(section.branches))
        return state.status
    finally:
        lease.release()


def _flow(workflow: dict[str, Any], changed: dict[str, Any] | None = None) -> WorkflowFlow:
    """An advance's flow: node instances of this task's own, from the run's workflow validated once per
    content on this process (every advance and branch advance of a run reads the same one), with the batch limits
    `chordflow update` `changed` laid over it (worker/batch/overrides.py)."""
    return build_flow(load(overrides.apply_to_workflow(workflow, changed or {})))


def _section(workflow: dict[str, Any], key: str, flow: WorkflowFlow | None = None) -> Section:
    """The section a branch key (`<fork>:parallel#<step>`) names."""
    flow = flow or _flow(workflow)
    return flow.sections[key.rsplit("#", 1)[0]]


def _join(runs: ClusterRuns, run_id: str, key: str, branch: str, branches: int) -> None:
    """The branch has ended: the last of the section's branches to end hands the run back to the fan-in."""
    if runs.join(run_id, key, branch) >= branches:
        send_advance(Advance(run_id, int(key.rsplit("#", 1)[1])))


def _branch_state(runs: ClusterRuns, run_id: str, key: str, branch: str) -> BranchState | None:
    return StoredBranches(runs, run_id).load(key).get(branch)
