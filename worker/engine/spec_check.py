"""A node spec from a task message, checked on the worker as validation checks it before anything is built.

Validation (`scheduler.compiler.load`) checks a workflow where it is submitted; a worker receives one node
spec per chunk message. Messages are signed (worker/cluster/signing.py), yet a worker still builds nothing that
validation refuses: a spec that is not a node, an unregistered type, params that the type's own
`check_params` rejects (e.g. a template inside a `shell` command string), templates that do not parse.
"""

from __future__ import annotations

from typing import Any

import pydantic

from ir.errors import NodeTypeError, TemplateError, ValidationError
from ir.models import NodeSpec
from ir.templates import references
from worker.nodes import registry


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
    """What a node type's own `check_params(raw_params)` finds, each problem prefixed with `where`.

    The check returns None, a problem with the params as a whole, or `{param name: problem}`; one that
    raises is a problem too, never a traceback. Validation (`scheduler.compiler.load`) and workers both ask.
    """
    check = getattr(cls, "check_params", None)
    try:
        found = check(params) if check else None
    except Exception as exc:
        found = f"cannot be checked ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
    if isinstance(found, dict):
        return [f"{where}.{name}: {problem}" for name, problem in found.items()]
    return [f"{where}: {found}"] if found else []
