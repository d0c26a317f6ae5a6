"""Where a run goes on under an edited workflow: the completed steps that still hold, and the first that
does not.

Walking the run's trail from its first step, a step is kept (`↻ cached`) while the edited flow would run
the same node there (same start, same successor for the action the node returned) and the node's config
hash (worker/engine/config_hash.py) is the one its checkpoint recorded. The first step that differs — a changed
node, a node removed or renamed, an edge that now leads elsewhere — and every step after it run again:
the run is rewound to before that step (its store from the undo log, its batch outcomes dropped). Nodes
added or changed off the route the run took change nothing until the flow reaches them. A step that ended
the run with an unhandled `error` action is the failure, never kept.

The values a kept node read need no comparison: the store before each kept step is the one recorded, so
they are the ones its checkpoint hashed. Only the config can differ. A step recorded without hashes (by
an older chordflow, or a parallel section) counts as changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ir.models import NodeSpec
from worker.engine.config_hash import config_hash, facts_of
from worker.engine.flow import WorkflowFlow
from worker.runs.record import RunRecord, TrailStep
from worker.runs.store import RunStore, rewind


@dataclass(frozen=True)
class ResumePoint:
    """The first step that runs (the ones before it are kept), the node it runs, and why."""

    step: int
    node: str | None  # None: the edited flow ends after the kept steps
    kept: list[str] = field(default_factory=list)  # the nodes of the kept steps, in order
    reason: str | None = None  # the first difference found; None: nothing changed
    rewind: bool = False  # whether what the run recorded from `step` on is dropped


def resume_point(steps: list[TrailStep], record: RunRecord, flow: WorkflowFlow) -> ResumePoint:
    """Where run `record` (whose completed steps are `steps`) goes on under the workflow of `flow`."""
    expected: str | None = flow.start_id
    nodes = [s.node for s in steps]
    for i, step in enumerate(steps):  # the nodes before step i are kept: nodes[:i]
        if step.node != expected:
            why = f"the flow now goes to '{expected}' at step {i}, not '{step.node}'" if expected else "the flow ends"
            return ResumePoint(i, expected, nodes[:i], why, rewind=True)
        facts = facts_of(flow, step.node)
        if step.config is None or facts is None or facts.config != step.config:
            return ResumePoint(i, step.node, nodes[:i], f"node '{step.node}' changed", rewind=True)
        successor = getattr(flow.get_next_node(flow.nodes[step.node], step.action), "node_id", None)
        if successor is None and step.action == "error":  # it ended the run failed: run it again
            return ResumePoint(i, step.node, nodes[:i], f"node '{step.node}' returned 'error'", rewind=True)
        expected = successor
    if expected != record.node:
        why = f"the flow now goes on with '{expected}'" if expected else "the flow now ends here"
        return ResumePoint(len(steps), expected, nodes, why, rewind=True)
    if expected is not None and _changed(record.workflow, flow, expected):
        return ResumePoint(len(steps), expected, nodes, f"node '{expected}' changed", rewind=True)
    return ResumePoint(len(steps), expected, nodes)


def _changed(old_workflow: dict[str, Any], flow: WorkflowFlow, node_id: str) -> bool:
    """Whether the node the run stopped at (not completed: no checkpoint) differs in the edited flow."""
    old = next((n for n in old_workflow.get("nodes", []) if n.get("id") == node_id), None)
    facts = facts_of(flow, node_id)
    return old is None or facts is None or config_hash(NodeSpec.model_validate(old)) != facts.config


def go_on_under(runs: RunStore, record: RunRecord, flow: WorkflowFlow, source: str | None) -> ResumePoint:
    """Point a finished run of `runs` at its resume point under the workflow of
    `flow`: rewound to it when something changed, the edited workflow in its record."""
    point = resume_point(runs.steps(record.run_id), record, flow)
    if point.rewind:
        rewind(runs, record.run_id, point.step)
    runs.set_workflow(record.run_id, flow.workflow.wire(), source, point.node)
    return point


def items_from_checkpoint(runs: RunStore, run_id: str, node: str | None, step: int) -> int:
    """How many items of the batch node a run stopped in already have an outcome that a resume keeps (both
    backends run a kept chunk with a failed item again: the cause may be fixed now)."""
    if node is None:
        return 0
    return sum(len(c.results) for c in runs.saved_chunks(run_id, f"{node}#{step}") if not c.failures)
