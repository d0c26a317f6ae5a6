"""A run's inputs checked against the workflow's declared inputs: the rule of every run, top-level or sub-workflow.

It lives in `ir` because a `workflow` node applies it on a worker (a sub-run) as the scheduler does for a run;
`scheduler.inputs` re-exports it next to the CLI's parsing of `--input k=v`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

from ir.errors import ValidationError
from ir.limits import check_value, problem_in
from ir.models import Workflow


def _closest(name: str, wf: Workflow) -> str | None:
    close = difflib.get_close_matches(name, list(wf.inputs or {}), n=1)
    return close[0] if close else None


def unknown_input(wf: Workflow, name: str) -> str | None:
    """Why `name` is not an input of `wf` (with a did-you-mean), or None when it is one.

    A workflow that declares no inputs accepts any name.
    """
    declared = list(wf.inputs or {})
    if not wf.declares_inputs or name in declared:
        return None
    close = _closest(name, wf)
    hint = f"did you mean '{close}'?" if close else f"declared inputs: {', '.join(declared)}"
    return f"unknown input '{name}' ({hint})"


def apply_inputs(
    wf: Workflow,
    store: dict[str, Any],
    inputs: dict[str, Any] | None,
    encoded: Iterable[str] = (),
    *,
    how: str = "pass --input {name}=...",
) -> None:
    """Check `inputs` against the workflow's declared inputs, fill in defaults, and put them in `store`.

    `encoded`: names of inputs given already encoded (an inputs file read straight into the run's store
    bytes): checked as names, given no default, not put in `store`. `how`: how a missing required input
    is given (`{name}` is its name), told in the problem.
    """
    declared = wf.inputs or {}
    # Each declared input given, no other, none too deep (a dataset record's, once per record): nothing else to do.
    if (
        not encoded
        and inputs is not None
        and inputs.keys() == declared.keys()
        and not any(map(problem_in, inputs.values()))
    ):
        store.update(inputs)
        return
    given = dict(inputs or {})
    names = [*given, *(name for name in encoded if name not in given)] if encoded else given
    problems: list[str] = []
    suggested: set[str | None] = set()
    if strays := [name for name in names if name not in declared]:  # none, once a run's inputs are right
        problems = [f"inputs: {problem}" for name in strays if (problem := unknown_input(wf, name))]
        suggested = {_closest(name, wf) for name in strays}  # a typo explains these
    for name, value in given.items():
        try:
            check_value(value, f"inputs.{name}")
        except ValidationError as exc:
            problems.extend(exc.problems)
    for name, spec in declared.items():
        if name in names or name in store:
            continue
        if spec.default is not None:
            given[name] = spec.default
        elif spec.required and name not in suggested:
            problems.append(f"inputs.{name}: required input '{name}' was not given; {how.format(name=name)}")
    if problems:
        raise ValidationError(problems)
    store.update(given)
