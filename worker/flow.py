"""A compiled workflow: a PocketFlow Flow of wrapped nodes, built on the scheduler and on workers alike."""

from __future__ import annotations

from pocketflow import BaseNode, Flow

import ir
from worker.build import build_chain


class WorkflowFlow(Flow):
    """A pocketflow Flow that knows its workflow and ends quietly when an action has no edge."""

    def __init__(self, start: BaseNode, workflow: ir.Workflow, nodes: dict[str, BaseNode]):
        super().__init__(start=start)
        self.workflow = workflow
        self.nodes = nodes  # node id -> its outermost wrapper
        self.start_id = workflow.start_id()

    def get_next_node(self, curr: BaseNode, action: str | None) -> BaseNode | None:
        return curr.successors.get(action or "default")


def build_flow(wf: ir.Workflow) -> WorkflowFlow:
    """Wrapper chains for every node of an already validated workflow, wired by its edges."""
    chains = {spec.id: build_chain(spec) for spec in wf.nodes}
    for edge in wf.effective_edges():
        chains[edge.from_].successors[edge.action] = chains[edge.to]
    return WorkflowFlow(chains[wf.start_id()], wf, chains)
