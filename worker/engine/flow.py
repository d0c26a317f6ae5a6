"""A compiled workflow: a PocketFlow Flow of wrapped nodes, built on the scheduler and on workers alike."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from pocketflow import BaseNode, Flow

import ir
from ir import branches
from ir.branches import Section
from worker.engine.build import build_chain
from worker.nodes import registry

#: Workflows validated per process, by content: every execution of a sub-workflow, every task of a cluster run.
CACHE_SIZE = 32
_validated: OrderedDict[str, ir.Workflow] = OrderedDict()
_lock = threading.Lock()


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


def validated(workflow: Any) -> ir.Workflow:
    """`ir.load` of a workflow already included (a wire dict), with this process's node types, once per content.

    The IR is only read afterwards (build_flow builds new node instances from it), so one copy serves every thread.
    """
    try:
        key: str | None = json.dumps(workflow, sort_keys=True, default=repr)
    except (TypeError, ValueError):  # keys that do not sort: loaded every time
        key = None
    with _lock:
        loaded = _validated.get(key) if key is not None else None
        if loaded is not None:
            _validated.move_to_end(key)
            return loaded
    loaded = ir.load(workflow, node_types=registry.names())
    if key is not None:
        with _lock:
            _validated[key] = loaded
            while len(_validated) > CACHE_SIZE:
                _validated.popitem(last=False)
    return loaded
