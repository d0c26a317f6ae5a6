"""The ONE loader of workflows: every path that runs or checks a workflow — validation, compile, a worker's
advance, a sub-workflow, a dataset job — loads it here, with this process's node types and each type's own
param check, so nothing runs that validation would refuse.

`ir.load` knows no node types; this adds them (`registry.names()`) and runs each node class's
`check_params(raw_params)` on the unresolved params: it returns None, a problem with the params as a whole
(e.g. `shell` rejects templates inside a command string), or `{param name: problem}` to name the param
(e.g. `python`: the function does not import). A wire dict (what a worker reads from a run record) is
validated once per content in a process. A chunk message carries one node spec, not a workflow:
`checked_spec` checks it the same way.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pydantic

import ir
from ir import branches
from ir.errors import NodeTypeError, TemplateError, ValidationError, shown_key
from ir.models import NodeSpec
from ir.templates import references
from worker.nodes import registry, wait
from worker.nodes.params import static_problems

#: Workflows validated per process, by content: every execution of a sub-workflow, every task of a cluster run.
CACHE_SIZE = 32
_loaded: OrderedDict[str, ir.Workflow] = OrderedDict()
_lock = threading.Lock()


def load(workflow: Any, inputs: Collection[str] = ()) -> ir.Workflow:
    """A validated workflow from a dict, JSON text or path (or an `ir.Workflow`, as it is); one
    ValidationError listing every problem, node types and params included.

    `inputs`: the names of the inputs a run is given, declared in a workflow that declares none (`ir.load`)."""
    if isinstance(workflow, ir.Workflow) and (workflow.declares_inputs or set(inputs) <= set(workflow.inputs or {})):
        return workflow
    if inputs:  # a run being started: once per run, not worth a cache entry
        return _with_defaults(ir.load(workflow, node_types=registry.names(), node_checks=node_problems, inputs=inputs))
    key = _key(workflow) if isinstance(workflow, dict) else None
    if key is not None:
        with _lock:
            loaded = _loaded.get(key)
            if loaded is not None:
                _loaded.move_to_end(key)
                return loaded
    loaded = _with_defaults(ir.load(workflow, node_types=registry.names(), node_checks=node_problems))
    if key is not None:
        with _lock:
            _loaded[key] = loaded
            while len(_loaded) > CACHE_SIZE:
                _loaded.popitem(last=False)
    return loaded


def _with_defaults(workflow: ir.Workflow) -> ir.Workflow:
    """The workflow's `cache` as the param of each node whose type takes one and that sets none itself."""
    if workflow.cache is not None:
        known = registry.all_types()
        for spec in workflow.nodes:
            if "cache" in getattr(known.get(spec.type), "PARAMS", {}):
                spec.params.setdefault("cache", workflow.cache)
    return workflow


def source_of(workflow: Any) -> str | None:
    """The file a workflow came from (named in messages, kept in a run's record), when given as a path."""
    if isinstance(workflow, Path) or (isinstance(workflow, str) and not workflow.lstrip().startswith(("{", "["))):
        return str(workflow)
    return None


def _key(workflow: dict[str, Any]) -> str | None:
    try:
        return json.dumps(workflow, sort_keys=True, default=repr)
    except (TypeError, ValueError):  # keys that do not sort: loaded every time
        return None


def node_problems(workflow: ir.Workflow) -> list[str]:
    """What each node's type finds in its params, every node's problems together (an unknown type is ir's problem),
    and waits where they would hold what runs them."""
    known = registry.all_types()
    return [
        problem
        for i, spec in enumerate(workflow.nodes)
        if spec.type in known
        for problem in param_problems(known[spec.type], spec.params, f"nodes[{i}] (id '{spec.id}').params")
    ] + wait_problems(workflow)


def waiting_nodes(workflow: ir.Workflow) -> list[tuple[int, NodeSpec, str]]:
    """(index, spec, what) of each node that makes its run wait: a `wait` node, an `llm` batch with `provider_batch`."""
    found = []
    for i, spec in enumerate(workflow.nodes):
        if spec.type == wait.NODE_TYPE:
            found.append((i, spec, "a wait node"))
        elif spec.batch is not None and spec.batch.provider_batch is not None:
            found.append((i, spec, "a provider batch"))
    return found


def wait_problems(workflow: ir.Workflow) -> list[str]:
    """What waits runs at the run's top level only: a batch of waits, or a wait in a parallel branch, would hold a
    worker for as long as it waits (a sub-workflow's: worker/nodes/subworkflow.py). `provider_batch` is for `llm`
    nodes only."""
    waiting = waiting_nodes(workflow)
    if not waiting:
        return []
    in_branch = {n for section in branches.sections(workflow) for nodes in section.members.values() for n in nodes}
    problems = []
    for i, spec, what in waiting:
        where = f"nodes[{i}] (id '{spec.id}'): {what} waits at the run's top level only"
        if spec.type == wait.NODE_TYPE and spec.batch:
            problems.append(f"{where}, not as a batch node")
        if spec.type not in (wait.NODE_TYPE, "llm"):
            problems.append(f"nodes[{i}] (id '{spec.id}'): batch.provider_batch is for llm nodes only, not {spec.type}")
        if spec.id in in_branch:
            problems.append(f"{where}, not in a parallel branch")
    return problems


def checked_spec(wire: Any) -> NodeSpec:
    """The NodeSpec of `wire`, or a ValidationError naming the node and every problem (nothing is built)."""
    label = f"node {wire.get('id')!r}" if isinstance(wire, dict) else "node spec"
    try:
        spec = NodeSpec.model_validate(wire)
    except pydantic.ValidationError as exc:
        problems = [f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg']}" for e in exc.errors()]
        raise ValidationError(problems, source=label) from None
    try:
        cls = registry.get(spec.type)
    except NodeTypeError as exc:
        raise ValidationError(str(exc), source=label) from None
    problems = []
    for name, value in spec.params.items():
        try:
            references(value)
        except TemplateError as exc:
            problems.append(f"params.{name}: {exc}")
    problems += param_problems(cls, spec.params, "params")
    if problems:
        raise ValidationError(problems, source=label)
    return spec


def param_problems(cls: type, params: dict[str, Any], where: str) -> list[str]:
    """What a node type's declared params (`PARAMS`, worker/nodes/params.py) and its own `check_params(raw_params)`
    find, each problem prefixed with `where`; a param is named once, by the declaration first.

    The check returns None, a problem with the params as a whole, or `{param name: problem}`; one that
    raises is a problem too, never a traceback. `load` and `checked_spec` both ask.
    """
    declared = static_problems(getattr(cls, "PARAMS", None), params)
    check = getattr(cls, "check_params", None)
    try:
        found = check(params) if check else None
    except Exception as exc:
        found = f"cannot be checked ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
    if isinstance(found, dict):
        declared.update((name, problem) for name, problem in found.items() if name not in declared)
        found = None
    problems = [f"{where}.{shown_key(name)}: {problem}" for name, problem in declared.items()]
    return problems + ([f"{where}: {found}"] if found else [])
