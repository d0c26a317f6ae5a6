"""A compiled workflow: a PocketFlow Flow of wrapped nodes, built on the scheduler and on workers alike."""

from __future__ import annotations

from pocketflow import BaseNode, Flow

import ir
from ir import branches
from ir.branches import Section
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

    def get_next_node(self, curr: BaseNode, action: str | None) -> BaseNode | Section | None:
        """The next node, or — after a fork's parallel action — its section (the stepper runs the branches)."""
        action = action or "default"
        section = self._forks.get((getattr(curr, "node_id", None), action))
        return section if section is not None else curr.successors.get(action)


def build_flow(wf: ir.Workflow) -> WorkflowFlow:
    """Wrapper chains for every node of an already validated workflow, wired by its edges."""
    chains = {spec.id: build_chain(spec) for spec in wf.nodes}
    for edge in wf.effective_edges():
        if not edge.parallel:
            chains[edge.from_].successors[edge.action] = chains[edge.to]
    return WorkflowFlow(chains[wf.start_id()], wf, chains)
