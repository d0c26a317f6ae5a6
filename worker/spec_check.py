"""A node spec from a task message, checked on the worker as validation checks it before anything is built.

Validation (`scheduler.compiler.load`) checks a workflow where it is submitted; a worker receives one node
spec per chunk message. Messages are signed (worker/signing.py), yet a worker still builds nothing that
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
    check = getattr(cls, "check_params", None)
    try:
        found = check(spec.params) if check else None
    except Exception as exc:  # as validation does: a failing check is a problem, not a traceback
        found = f"cannot be checked ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
    if isinstance(found, dict):
        problems.extend(f"params.{name}: {problem}" for name, problem in found.items())
    elif found:
        problems.append(f"params: {found}")
    if problems:
        raise ValidationError(problems, source=label)
    return spec
