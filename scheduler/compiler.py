"""Compile a workflow IR into a PocketFlow Flow of wrapped nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ir
from worker.flow import WorkflowFlow, build_flow
from worker.nodes import registry


def load(workflow: Any) -> ir.Workflow:
    """`ir.load` plus the checks that need the registry: node types, and each type's own param check.

    A node class may define `check_params(raw_params)`, run on the unresolved params: it returns None,
    a problem with the params as a whole (e.g. `shell` rejects templates inside a command string), or
    `{param name: problem}` to name the param (e.g. `python`: the function does not import).
    """
    if isinstance(workflow, ir.Workflow):
        return workflow
    wf = ir.load(workflow, node_types=registry.names())
    problems = []
    for i, spec in enumerate(wf.nodes):
        where = f"nodes[{i}] (id '{spec.id}').params"
        check = getattr(registry.get(spec.type), "check_params", None)
        try:
            found = check(spec.params) if check else None
        except Exception as exc:  # a node type's check must not turn a user error into a traceback
            found = f"cannot be checked ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
        if isinstance(found, dict):
            problems.extend(f"{where}.{name}: {problem}" for name, problem in found.items())
        elif found:
            problems.append(f"{where}: {found}")
    if problems:
        is_file = isinstance(workflow, Path) or (
            isinstance(workflow, str) and not workflow.lstrip().startswith(("{", "["))
        )
        raise ir.ValidationError(problems, source=str(workflow) if is_file else None)
    return wf


def compile(workflow: Any) -> WorkflowFlow:
    return build_flow(load(workflow))
