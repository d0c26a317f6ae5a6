"""A run's inputs: parsing `--input k=v` values and checking them against the workflow's declared inputs."""

from __future__ import annotations

import json
from typing import Any

import ir
from ir.errors import ValidationError


def parse_input_value(text: str) -> Any:
    """`--input k=v`: JSON when it parses (numbers, booleans, lists), otherwise the plain string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def apply_inputs(wf: ir.Workflow, store: dict[str, Any], inputs: dict[str, Any] | None) -> None:
    given = dict(inputs or {})
    problems = []
    for name, spec in (wf.inputs or {}).items():
        if name in given or name in store:
            continue
        if spec.default is not None:
            given[name] = spec.default
        elif spec.required:
            problems.append(f"inputs.{name}: required input '{name}' was not given")
    if problems:
        raise ValidationError(problems)
    store.update(given)
