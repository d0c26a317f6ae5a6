"""Compile a workflow IR into a PocketFlow Flow of wrapped nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ir
from worker.engine.flow import WorkflowFlow, build_flow
from worker.engine.spec_check import param_problems
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
    problems = [
        problem
        for i, spec in enumerate(wf.nodes)
        for problem in param_problems(registry.get(spec.type), spec.params, f"nodes[{i}] (id '{spec.id}').params")
    ]
    if problems:
        is_file = isinstance(workflow, Path) or (
            isinstance(workflow, str) and not workflow.lstrip().startswith(("{", "["))
        )
        raise ir.ValidationError(problems, source=str(workflow) if is_file else None)
    return wf


def compile(workflow: Any) -> WorkflowFlow:
    return build_flow(load(workflow))
