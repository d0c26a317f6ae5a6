"""The stepper: advances a flow by one node, and the loop that drives it from a cursor to the end.

One step is PocketFlow's orchestration for one node (params, `_run`, next node by action), plus what a
checkpoint needs: the top-level store keys the node changed. Both backends drive the same loop; after
every step the journal records a checkpoint, so a run can go on from there (`resume`).
"""

from __future__ import annotations

import copy
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ir.branches import is_section
from ir.errors import RunCancelled, StepLimitExceeded
from ir.templates import resolve_template
from worker.engine.config_hash import facts_of
from worker.engine.context import RunContext
from worker.engine.flow import WorkflowFlow
from worker.store import is_dunder

#: Node executions allowed in one run unless the workflow's `max_steps` or CHORDFLOW_MAX_STEPS says otherwise.
DEFAULT_MAX_STEPS = 10_000


def max_steps(flow: WorkflowFlow) -> int:
    """The workflow's `max_steps`, else CHORDFLOW_MAX_STEPS, else DEFAULT_MAX_STEPS."""
    if flow.workflow.max_steps:
        return flow.workflow.max_steps
    value = os.environ.get("CHORDFLOW_MAX_STEPS", "")
    try:
        return int(value) if value.strip() else DEFAULT_MAX_STEPS
    except ValueError:
        raise ValueError(f"environment variable CHORDFLOW_MAX_STEPS must be an integer, got {value!r}") from None


@dataclass
class Cursor:
    """Where a run stands: the next node to execute (None: the flow ended) and how many steps ran."""

    node: str | None
    step: int = 0
    last_action: Any = None


@dataclass
class Step:
    """What one node execution did: its action, the next node, and the top-level keys it changed; with
    `config` and `reads`, the hashes of the node's configuration and of the values it read
    (worker/engine/config_hash.py; "" when unknown), so a resume with an edited workflow knows what still holds."""

    node: str
    action: Any
    next_node: str | None
    changed: dict[str, Any] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    config: str = ""
    reads: str = ""
    created: list[str] = field(default_factory=list)  # changed keys that did not exist before (nothing to undo)


class Journal(Protocol):
    """Where checkpoints go (the embedded store for local runs, Redis for cluster runs)."""

    def checkpoint(self, step: int, result: Step) -> None: ...


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
) -> Cursor:
    """Run nodes from `cursor` until the flow ends (or `stop_before(node)` says to hand over); checkpoint
    after each. Past the step limit the run fails naming the nodes that kept looping."""
    limit = max_steps(flow)
    recent: deque[str] = deque(maxlen=2 * len(flow.nodes) + 2)
    while cursor.node is not None:
        if stop_before is not None and stop_before(cursor.node):  # first: a branch at its fan-in has finished
            return cursor
        if ctx.cancelled.is_set():
            raise RunCancelled("run cancelled")
        if cursor.step >= limit:
            raise StepLimitExceeded(
                f"run stopped after {limit} steps (max_steps): {loop_of(list(recent), cursor.node)} kept looping"
            )
        ctx.step = cursor.step
        if is_section(cursor.node):
            ctx.last_node = cursor.node  # where a failed run resumes: the section (its finished branches kept)
            step = _sections(ctx).run(flow, flow.sections[cursor.node], store, ctx)
            for key in step.deleted:
                store.pop(key, None)
            store.update(step.changed)
        else:
            step = run_step(flow, cursor.node, store)
        if journal is not None:
            journal.checkpoint(cursor.step, step)
        recent.append(step.node)
        cursor = Cursor(step.next_node, cursor.step + 1, step.action)
    return cursor


def _sections(ctx: RunContext) -> Any:
    """What runs a parallel section here: the context's, else branches on threads of this process."""
    if ctx.sections is None:
        from worker.engine.sections import ThreadedSections  # it drives branches with this module's `drive`

        ctx.sections = ThreadedSections()
    return ctx.sections


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
    declared = flow.workflow.outputs or {}
    return "success", None, {name: resolve_template(o.source, store, f"outputs.{name}") for name, o in declared.items()}
