"""`workflow`: a node that runs another workflow (a sub-workflow) on a fresh store of its own.

`ir.load` has included the sub-workflow already (ir/subworkflows.py): `params.workflow` is its validated IR,
so the node needs no file and runs wherever the node runs. Its flow is compiled once per content in a
process; every execution — so every item of a batch over the node — gets its own store and its own node
instances. The sub-workflow runs in the process that executes the node, with the stepper, without a run
record, its batch nodes in-process (on the cluster too: a chunk task or an `advance` running the node does
not fan out again); the parent run's cancel flag stops it between its nodes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pocketflow import Node

from ir import subworkflows
from ir.errors import SubworkflowFailed, ValidationError
from ir.inputs import apply_inputs
from worker.engine import context
from worker.engine.context import RunContext
from worker.nodes import registry
from worker.store import is_dunder

#: Flows kept per thread (their IR is validated once per content in a process: worker/engine/loader.py).
CACHE_SIZE = 32
_local = threading.local()
#: worker.engine.flow.WorkflowFlow, not imported here: worker.engine.flow imports the registry, which imports this.
Flow = Any


@dataclass(slots=True)
class Call:
    """One execution of the node: what prep resolved, for exec and post (nothing is kept on the node). Not frozen:
    a frozen dataclass's __init__ (object.__setattr__ per field) costs ~0.8 us per record against ~0.2 us."""

    node_id: str
    workflow: Any  # the sub-workflow's IR (a path only when the spec did not come through `ir.load`)
    inputs: dict[str, Any]
    source: str | None  # the sub-workflow's file (None: inline), for messages
    accumulators: dict[str, list]  # the parent's root dunder lists: the sub-run's appends reach them

    @property
    def what(self) -> str:
        return f"workflow node '{self.node_id}'" + (f" (sub-workflow {self.source})" if self.source else "")


@registry.register(subworkflows.NODE_TYPE)
class WorkflowNode(Node):
    """Runs the sub-workflow on a store seeded with `inputs` (checked like a run's inputs), then writes its
    declared outputs into the node's namespace — or, when it declares none, its nodes' final namespaces."""

    PARAMS = {
        "workflow": "(required) the sub-workflow: a path to its JSON file (relative to this workflow's file) "
        "or a workflow object; its templates are its own",
        "inputs": "the sub-workflow's inputs: an object of values and templates, or one template resolving to one",
        "source": "set when the workflow is loaded: the file the sub-workflow came from (named in messages)",
    }

    @staticmethod
    def check_params(params: dict[str, Any]) -> str | None:
        """The sub-workflow validated again with this process's node types, and its nodes' own param checks
        (`check_params`, recursively): what validation and workers check for a node of the parent. A file ir.load
        could not include is not read again here: its problem is reported once."""
        from worker.engine import loader  # it imports the registry, which imports this module

        if not isinstance(params.get(subworkflows.WORKFLOW), Mapping):  # not included: ir.load named why
            return None
        source = params.get(subworkflows.SOURCE)
        named = f"{source}: " if isinstance(source, str) and source else "sub-workflow: "
        try:
            sub = loader.load(params.get(subworkflows.WORKFLOW))
        except ValidationError as exc:
            return named + "; ".join(exc.problems)
        waiting = loader.waiting_nodes(sub)
        if waiting:  # a sub-workflow runs in its parent's process, to its end: a wait would hold it
            _, spec, what = waiting[0]
            return named + f"node '{spec.id}': {what} waits at the run's top level only, not in a sub-workflow"
        return None

    def prep(self, shared: Any) -> Call:
        node_id = getattr(shared, "node_id", subworkflows.NODE_TYPE)
        inputs = self.params.get(subworkflows.INPUTS)
        if inputs is None:
            inputs = {}
        if type(inputs) is not dict and not isinstance(inputs, Mapping):  # a dict checked without the ABC
            raise ValueError(
                f"workflow node '{node_id}': param 'inputs' must be an object of inputs, got {type(inputs).__name__}"
            )
        source = self.params.get(subworkflows.SOURCE)
        root = getattr(shared, "root", shared)
        accumulators = {key: value for key, value in root.items() if isinstance(value, list) and is_dunder(key)}
        workflow = self.params.get(subworkflows.WORKFLOW)
        return Call(node_id, workflow, dict(inputs), source if isinstance(source, str) else None, accumulators)

    def exec(self, call: Call) -> dict[str, Any]:
        """The sub-run's outputs. What it appended to the parent's lists (its model calls) reaches them whether it
        succeeded or not: a failed sub-run's calls were billed too."""
        sub = _flow(call.workflow)
        flow = sub.flow
        store: dict[str, Any] = {key: [] for key in call.accumulators}
        try:
            apply_inputs(flow.workflow, store, call.inputs, how=f"give it in params.inputs of node '{call.node_id}'")
        except ValidationError as exc:
            raise ValueError(f"{call.what}: {exc}") from None
        try:
            status, error, outputs = _run(sub, store, call)
        finally:
            for key, entries in call.accumulators.items():
                entries.extend(store.get(key) or ())
        if status != "success":
            raise SubworkflowFailed(f"{call.what} failed: {error}")
        if flow.workflow.outputs is None:
            outputs = {
                key: value
                for key, value in store.items()
                if key in flow.nodes and not is_dunder(key) and isinstance(value, dict)
            }
        return outputs

    def post(self, shared: Any, prep_res: Call, exec_res: dict[str, Any]) -> str:
        for key, value in exec_res.items():
            shared[key] = value
        return "default"


def _run(sub: SubFlow, store: dict[str, Any], call: Call) -> tuple[str, str | None, dict[str, Any]]:
    """Drive the sub-workflow to its end in this process, in a run context of its own (events dropped, batches
    in-process, no run record) that shares the parent run's cancel flag; the parent's context is left as it was."""
    ctx = sub.context()
    token = context.enter(ctx)
    try:
        action = sub.drive(store, ctx)
    except Exception as exc:
        node = f" node '{ctx.last_node}'" if ctx.last_node else ""
        exc.add_note(f"raised in{node} of {call.what}")
        raise
    finally:
        context.leave(token)
    if action == "error":  # `ending` says which node and why
        return sub.stepper.ending(sub.flow, sub.stepper.Cursor(None, 0, action), store, ctx.last_node)
    return "success", None, {name: resolve(store) for name, resolve in sub.flow.outputs}


@dataclass
class SubFlow:
    """A sub-workflow compiled for this thread: its flow, its step limit (CHORDFLOW_MAX_STEPS unless the
    sub-workflow sets one, read once: reading the environment was the dearest part of a small sub-run), and the
    run context its runs reuse."""

    workflow: Any  # held: keeps the id the cache finds it by from being reused
    flow: Flow
    limit: int
    #: worker.engine.stepper, imported when the flow is compiled (it imports the registry, which imports this
    #: module) and kept here: an import statement per run was ~1 us of a dataset record's ~17.
    stepper: ModuleType
    #: `stepper.quiet(flow, limit)`: the sub-run's steps compiled once (the plan walked without a Cursor per run).
    drive: Callable[[dict[str, Any], RunContext], str | None]
    ctx: RunContext | None = None

    def context(self) -> RunContext:
        """The context of a run about to start, sharing the parent run's cancel flag (made again when the parent's
        flag is another: another run). Runs of one flow in one thread follow one another, and a sub-workflow never
        contains itself, so no two runs hold it at once."""
        parent = context.current()
        if self.ctx is None or self.ctx.cancelled is not parent.cancelled:
            self.ctx = RunContext(cancelled=parent.cancelled)
        self.ctx.last_node, self.ctx.step = None, 0
        self.ctx.answers, self.ctx.budget = parent.answers, parent.budget
        return self.ctx


def _flow(workflow: Any) -> SubFlow:
    """The sub-workflow's SubFlow, with node instances of this thread's own.

    Executions in one thread follow one another (a sub-workflow never contains itself), so a thread reuses its
    instances; concurrent items (threads, worker processes) never share them. The IR is validated once per
    content in a process; a thread finds its flow by the identity of the (constant) `workflow` param first.
    """
    flows: OrderedDict[int, SubFlow] = _local.__dict__.setdefault("flows", OrderedDict())
    entry = flows.get(id(workflow))
    if entry is not None and entry.workflow is workflow:
        return entry
    from worker.engine import stepper
    from worker.engine.flow import build_flow
    from worker.engine.loader import load

    flow = build_flow(load(workflow))
    limit = stepper.max_steps(flow)
    entry = flows[id(workflow)] = SubFlow(workflow, flow, limit, stepper, stepper.quiet(flow, limit))
    while len(flows) > CACHE_SIZE:
        flows.popitem(last=False)
    return entry
