"""Param declarations of the node types, and the one check of a param's value.

Each built-in node type declares its params once (`PARAMS = {name: Param(...)}`): what `chordflow nodes` shows,
what validation checks on the unresolved IR (`static_problems`: unknown names with a did-you-mean, required params
missing, literal values of the wrong type or refused by the param's own check), and what `Param.get` checks in
prep once templates are resolved, with the same wording ("<type>: param '<name>' is required", "... must be a
string, got int"). A plugin may declare plain `{name: description}`; only `Param` declarations are checked.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ir.errors import TemplateError, shown
from ir.templates import references

DESCRIPTIONS: dict[type, str] = {
    str: "a string",
    dict: "a dict",
    list: "a list",
    bool: "a boolean",
    int: "a number",
    float: "a number",
}
#: The declared name that stands for "any other param" (echo, python).
ANY = "*"


def describe(kinds: tuple[type, ...]) -> str:
    """'a string', 'a number', 'a string or a list': what a value of one of `kinds` is called."""
    names = [DESCRIPTIONS.get(kind, f"a {kind.__name__}") for kind in kinds]
    return " or ".join(dict.fromkeys(names))


@dataclass(frozen=True)
class Param:
    """One declared param: its description (shown by `chordflow nodes`) and what its value must be.

    A missing value is an error when `required` (`empty_is_missing` also counts "" as missing). A boolean passes
    as a number only when `bool` is one of `kinds`. `check`, if given, must accept the value too; a failure shows
    the value itself, a wrong type only its type name. `what` replaces the description made from `kinds`.
    """

    doc: str
    kinds: type | tuple[type, ...] = object
    required: bool = False
    default: Any = None
    what: str | None = None
    check: Callable[[Any], Any] | None = None
    empty_is_missing: bool = False

    def __str__(self) -> str:
        return self.doc

    def get(self, node_type: str, params: Mapping[str, Any], name: str) -> Any:
        """`params[name]` as declared, or `default` when it is missing or None; ValueError naming the param."""
        value = params.get(name)
        problem = self.problem(value)
        if problem is not None:
            raise ValueError(f"{node_type}: param '{name}' {problem}")
        return self.default if self._missing(value) else value

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` for this param ('is required', 'must be a string, got int'), or None."""
        if self._missing(value):
            return "is required" if self.required else None
        kinds = self.kinds if isinstance(self.kinds, tuple) else (self.kinds,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and int in kinds and bool not in kinds):
            got = type(value).__name__
        elif self.check is not None and not self.check(value):
            got = shown(value)
        else:
            return None
        return f"must be {self.what or describe(kinds)}, got {got}"

    def _missing(self, value: Any) -> bool:
        return value is None or (self.empty_is_missing and value == "")


def param(node_type: str, params: Mapping[str, Any], name: str, kinds: type | tuple[type, ...], **rules: Any) -> Any:
    """`params[name]` checked by a declaration made on the spot (a value that is not a node's own param)."""
    return Param("", kinds, **rules).get(node_type, params, name)


def static_problems(declared: Any, raw_params: Mapping[str, Any]) -> dict[str, str]:
    """What validation can tell from a node's unresolved params: `{param name: problem}`.

    Unknown names (unless the type takes any, `*`) get a did-you-mean among the declared names not given;
    a templated value is checked when it is resolved (in prep), except that a non-string holding templates
    must still be of the declared type.
    """
    if not isinstance(declared, Mapping) or not all(isinstance(p, Param) for k, p in declared.items() if k != ANY):
        return {}
    problems: dict[str, str] = {}
    free = [name for name in declared if name != ANY and name not in raw_params]
    for name in raw_params:
        if name not in declared and ANY not in declared:
            close = difflib.get_close_matches(str(name), free, n=1) if len(str(name)) <= 200 else []
            problems[name] = "unknown param" + (f" (did you mean '{close[0]}'?)" if close else "")
    for name, spec in declared.items():
        if name == ANY or (name in problems):
            continue
        value = raw_params.get(name)
        if isinstance(value, str) and _templated(value):
            continue
        if _templated(value):
            problem = spec.problem(value) if not isinstance(value, spec.kinds) else None
        else:
            problem = spec.problem(value)
        if problem is not None and not (spec.required and name not in raw_params and _misspelt(name, problems)):
            problems[name] = problem
    return problems


def _templated(value: Any) -> bool:
    try:
        return bool(references(value))
    except TemplateError:  # reported by the template check
        return True


def _misspelt(name: str, problems: dict[str, str]) -> bool:
    """A required param that is missing because an unknown one is its misspelling: reported once, there."""
    return any(problem.endswith(f"(did you mean '{name}'?)") for problem in problems.values())
