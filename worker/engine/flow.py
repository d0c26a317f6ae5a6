"""A compiled workflow: a PocketFlow Flow of wrapped nodes, built on the scheduler and on workers alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pocketflow import BaseNode, Flow

import ir
from ir import branches
from ir.branches import Section
from ir.templates import template_resolver
from worker.batch.cloning import runner
from worker.engine.build import build_chain


class WorkflowFlow(Flow):
    """A pocketflow Flow that knows its workflow and ends quietly when an action has no edge."""

    def __init__(self, start: BaseNode, workflow: ir.Workflow, nodes: dict[str, BaseNode]):
        super().__init__(start=start)
        self.workflow = workflow
        self.nodes = nodes  # node id -> its outermost wrapper
        self.start_id = workflow.start_id()
        self.sections = {s.node_id: s for s in branches.sections(workflow)}  # parallel sections by cursor id
        self._forks = {(s.fork, s.action): s for s in self.sections.values()}
        self._plan: dict[str, tuple[Callable[[Any], Any], dict[Any, str | None]]] | None = None
        declared = workflow.outputs or {}
        #: The declared outputs' templates compiled once: a dataset job resolves them for every record.
        self.outputs = [(name, template_resolver(o.source, f"outputs.{name}")) for name, o in declared.items()]

    def get_next_node(self, curr: BaseNode, action: str | None) -> BaseNode | Section | None:
        """The next node, or — after a fork's parallel action — its section (the stepper runs the branches)."""
        action = action or "default"
        section = self._forks.get((getattr(curr, "node_id", None), action))
        return section if section is not None else curr.successors.get(action)

    def plan(self) -> dict[str, tuple[Callable[[Any], Any], dict[Any, str | None]]]:
        """Per node id: its chain compiled once (worker/batch/cloning.py `runner`) and the id of what follows it by
        action (a node, or a fork's section): what a run nobody checkpoints steps through (a sub-workflow's, per
        record). Built on first use, from this flow's own instances."""
        if self._plan is None:
            plan = {}
            for node_id, node in self.nodes.items():
                after = {action: getattr(n, "node_id", None) for action, n in node.successors.items()}
                after.update((action, s.node_id) for (fork, action), s in self._forks.items() if fork == node_id)
                plan[node_id] = (runner(node), after)
            self._plan = plan
        return self._plan


def build_flow(wf: ir.Workflow) -> WorkflowFlow:
    """Wrapper chains for every node of an already validated workflow, wired by its edges."""
    chains = {spec.id: build_chain(spec) for spec in wf.nodes}
    for edge in wf.effective_edges():
        if not edge.parallel:
            chains[edge.from_].successors[edge.action] = chains[edge.to]
    return WorkflowFlow(chains[wf.start_id()], wf, chains)
