"""The stepper: advances a flow by one node (or one parallel section, its branches driven on threads of
this process unless the run context has another way), and the loop that drives it from a cursor to the end.

One step is PocketFlow's orchestration for one node (params, `_run`, next node by action), plus what a
checkpoint needs: the top-level store keys the node changed. Both backends drive the same loop; after
every step the journal records a checkpoint, so a run can go on from there (`resume`).
"""

from __future__ import annotations

import contextvars
import copy
import functools
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import ir
from ir.branches import Section
from ir.errors import RunCancelled, StepLimitExceeded
from ir.templates import resolve_template
from worker import redact, settings, tracing
from worker.batch.backend import Backend, LocalBackend
from worker.engine import context
from worker.engine.config_hash import facts_of
from worker.engine.context import RunContext
from worker.engine.flow import WorkflowFlow
from worker.engine.sections import BranchJournal, BranchSink, BranchState, BranchSteps, StopFlag, merged
from worker.engine.steps import Cursor, Journal, Step
from worker.store import is_dunder

#: Node executions allowed in one run unless the workflow's `max_steps` or CHORDFLOW_MAX_STEPS says otherwise.
DEFAULT_MAX_STEPS = 10_000


def max_steps(flow: WorkflowFlow) -> int:
    """The workflow's `max_steps`, else CHORDFLOW_MAX_STEPS, else DEFAULT_MAX_STEPS."""
    if flow.workflow.max_steps:
        return flow.workflow.max_steps
    value = settings.get("max_steps")  # read per run: a bad value fails only the runs that need it
    return DEFAULT_MAX_STEPS if value is None else value


def batch_nodes(flow: WorkflowFlow) -> set[str]:
    return {spec.id for spec in flow.workflow.nodes if spec.batch}


def run_step(flow: WorkflowFlow, node_id: str, store: dict[str, Any]) -> Step:
    """Execute one node on the store and report what changed.

    Changed keys are found without reading values: a key whose value is a different object, the node's
    own namespace (written in place), and root dunder containers (accumulators appended in place). So a
    checkpoint costs the same whatever the size of the rest of the store.
    """
    node = copy.copy(flow.nodes[node_id])
    node.set_params({})
    facts = facts_of(flow, node_id)
    reads = facts.reads(store) if facts is not None else ""  # before the node runs: what it reads
    before = {key: id(value) for key, value in store.items()}
    action = node._run(store)
    successor = flow.get_next_node(node, action)
    changed = {
        key: value
        for key, value in store.items()
        if before.get(key) != id(value) or key == node_id or (is_dunder(key) and isinstance(value, list | dict))
    }
    deleted = [key for key in before if key not in store]
    config = facts.config if facts is not None else ""
    created = [key for key in changed if key not in before]
    return Step(node_id, action, getattr(successor, "node_id", None), changed, deleted, config, reads, created)


def drive(
    flow: WorkflowFlow,
    cursor: Cursor,
    store: dict[str, Any],
    ctx: RunContext,
    journal: Journal | None = None,
    stop_before: Callable[[str], bool] | None = None,
    limit: int | None = None,
) -> Cursor:
    """Run nodes from `cursor` until the flow ends (or `stop_before(node)` says to hand over); checkpoint
    after each. Past the step limit (`limit`, default `max_steps(flow)`) the run fails naming the nodes that kept
    looping; the cancel flag is read before each node. Without a journal (a sub-workflow's in-memory run, once per
    dataset record) a node runs as its compiled chain (WorkflowFlow.plan): no Step is made, so neither what changed
    nor the hash of what it read is computed."""
    limit = max_steps(flow) if limit is None else limit
    plan, sections, cancelled = flow.plan(), flow.sections, ctx.cancelled
    recent: deque[str] = deque(maxlen=2 * len(flow.nodes) + 2)
    node, step, action = cursor.node, cursor.step, cursor.last_action
    while node is not None:
        if stop_before is not None and stop_before(node):  # first: a branch at its fan-in has finished
            break
        if cancelled.is_set():
            raise RunCancelled("run cancelled")
        if step >= limit:
            raise StepLimitExceeded(
                f"run stopped after {limit} steps (max_steps): {loop_of(list(recent), node)} kept looping"
            )
        ctx.step = step
        if journal is None and node not in sections:
            run, after = plan[node]
            action = run(store)
            recent.append(node)
            node, step = after.get(action or "default"), step + 1
            continue
        with tracing.span(f"step {node}", {"chordflow.node": node, "chordflow.step": step}):
            if node in sections:
                ctx.last_node = node  # where a failed run resumes: the section (its finished branches kept)
                done = _sections(ctx).run(flow, sections[node], store, ctx)
                for key in done.deleted:
                    store.pop(key, None)
                store.update(done.changed)
            else:
                done = run_step(flow, node, store)
        if journal is not None:
            journal.checkpoint(step, done)
        recent.append(done.node)
        node, step, action = done.next_node, step + 1, done.action
    return Cursor(node, step, action)


def quiet(flow: WorkflowFlow, limit: int) -> Callable[[dict[str, Any], RunContext], str | None]:
    """`drive` of a run nobody checkpoints, from the flow's start, compiled once per flow: a sub-workflow's run once
    per dataset record. Returns `run(store, ctx)`, the last node's action; the same cancel check before each node,
    the same step limit naming the loop (the nodes of its last steps are kept only once the limit is near). A flow
    with parallel sections is driven by `drive` (its branches' threads are not a record's cost to save)."""
    if flow.sections:
        start = flow.start_id

        def general(store: dict[str, Any], ctx: RunContext) -> str | None:
            return drive(flow, Cursor(start), store, ctx, limit=limit).last_action

        return general
    plan, start, kept = flow.plan(), flow.start_id, 2 * len(flow.nodes) + 2
    near = limit - kept

    def run(store: dict[str, Any], ctx: RunContext) -> str | None:
        cancelled, node, step, action = ctx.cancelled, start, 0, None
        recent: list[str] = []
        while node is not None:
            if cancelled.is_set():
                raise RunCancelled("run cancelled")
            if step >= near:
                if step >= limit:
                    raise StepLimitExceeded(
                        f"run stopped after {limit} steps (max_steps): {loop_of(recent[-kept:], node)} kept looping"
                    )
                recent.append(node)
            ctx.step = step
            call, after = plan[node]
            action = call(store)
            node, step = after.get(action or "default"), step + 1
        return action

    return run


def _sections(ctx: RunContext) -> Any:
    """What runs a parallel section here: the context's, else branches on threads of this process."""
    if ctx.sections is None:
        ctx.sections = ThreadedSections()
    return ctx.sections


class ThreadedSections:
    """Runs each branch of a section on a thread of its own; the stepper calls `run` at a section's cursor."""

    def __init__(
        self,
        journal: BranchJournal | None = None,
        backend_for: Callable[[RunContext], Backend] | None = None,
    ):
        self.journal = journal
        self.backend_for = backend_for or (lambda ctx: LocalBackend(ctx.cancelled, ctx.sink))

    def run(self, flow: Any, section: Section, store: dict[str, Any], ctx: RunContext) -> Step:
        key = ctx.batch_key(section.node_id)
        saved = self.journal.load(key) if self.journal else {}
        stop = threading.Event()
        states = [saved.get(b) or BranchState(b, b, ctx.step) for b in section.branches]
        for state in states:
            if not state.finished:
                state.status, state.error = "running", None
        failures: list[BranchState] = []  # in the order they happened
        lock = threading.Lock()

        def go(state: BranchState) -> None:
            self._branch(flow, section, store, ctx, state, stop, key)
            if state.status == "failed":
                with lock:
                    failures.append(state)
                if section.fail_fast:
                    stop.set()

        threads = [  # each in a copy of this context: the section's step span is its branches' parent
            threading.Thread(
                target=contextvars.copy_context().run, args=(go, s), name=f"branch-{s.branch}", daemon=True
            )
            for s in states
            if not s.finished
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if ctx.cancelled.is_set():
            raise RunCancelled("run cancelled")
        if section.fail_fast and failures:
            first = failures[0]
            if first.exception is not None:
                raise first.exception
            raise RuntimeError(f"branch '{first.branch}' failed: {first.error}")
        return merged(section, states)  # its checkpoint moves the run past `key`: its branches are not read again

    def _branch(
        self,
        flow: Any,
        section: Section,
        store: dict[str, Any],
        parent: RunContext,
        state: BranchState,
        stop: threading.Event,
        key: str,
    ) -> None:
        branch = state.branch
        bstore = dict(store)
        for name in state.deleted:
            bstore.pop(name, None)
        bstore.update(state.changed)
        sink = BranchSink(parent.sink, branch)
        ctx = RunContext(
            sink=sink,
            cancelled=StopFlag(lambda: parent.cancelled.is_set() or stop.is_set()),
            answers=parent.answers,
            budget=parent.budget,
        )
        ctx.backend = self.backend_for(ctx)
        journal = BranchSteps(state, functools.partial(self.journal.save, key) if self.journal else None)
        try:
            with context.using(ctx):
                cursor = drive(
                    flow, Cursor(state.node, state.step), bstore, ctx, journal, stop_before=section.fan_in.__eq__
                )
            state.status, state.node = "done", cursor.node
        except RunCancelled:
            state.status = "cancelled"
        except Exception as exc:
            state.status, state.exception = "failed", exc
            state.error = redact.mask(f"{type(exc).__name__}: {exc}")
            if not sink.erred:  # raised outside a node's own error event (e.g. the step limit)
                sink({"type": "error", "node": ctx.last_node, "error": state.error})
        if self.journal is not None and state.status != "cancelled":
            self.journal.save(key, state)
        if state.status != "cancelled":
            parent.emit({"type": "branch_complete", "branch": branch, "ok": state.status == "done"})


def loop_of(recent: list[str], upcoming: str) -> str:
    """`the nodes a -> b -> a` (or `the node a -> a`): the cycle that ends with the upcoming node."""
    if upcoming in recent:
        start = len(recent) - 1 - recent[::-1].index(upcoming)
        cycle = [*recent[start:], upcoming]
    else:
        cycle = [*recent, upcoming]
    noun = "the node" if len(set(cycle)) == 1 else "the nodes"
    return f"{noun} {' -> '.join(cycle)}"


def ending(
    flow: WorkflowFlow, cursor: Cursor, store: dict[str, Any], last_node: str | None
) -> tuple[str, str | None, dict]:
    """(status, error, outputs) of a flow that ran to its end: an unhandled `error` action fails the run;
    outputs are resolved only on success (a failed run may not have produced what they refer to)."""
    if cursor.last_action == "error":
        namespace = store.get(last_node) if last_node else None
        detail = namespace.get("error") or namespace.get("stderr") if isinstance(namespace, dict) else None
        return "failed", f"node '{last_node}' returned 'error'" + (f": {detail}" if detail else ""), {}
    return "success", None, {name: resolve(store) for name, resolve in flow.outputs}


def outputs(workflow: ir.Workflow, store: dict[str, Any]) -> dict[str, Any]:
    """A workflow's declared outputs, resolved on the store of a run that succeeded."""
    declared = workflow.outputs or {}
    return {name: resolve_template(o.source, store, f"outputs.{name}") for name, o in declared.items()}
