"""Nesting limits: checked before anything recurses, so deep input is a clear error, never a RecursionError.

One limit serves workflow documents, inputs files and store values: the IR's own code (templates,
validation, the snapshot codec) walks values recursively, and Python's stack allows about 1,000 frames.
A workflow document counts from its root object, an input value from itself: a document that validates
holds values shallower than any input may be, so nothing that validated fails later for its depth.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from ir.errors import ValidationError

#: The deepest nesting of objects/arrays accepted anywhere (workflow JSON, inputs, params).
MAX_DEPTH = 100
#: How many steps of a too-deep value's path are kept to name it (`nodes`, 0, `params`, `p`).
PATH_KEPT = 4

#: A JSON string (closed or not) or a bracket: strings are skipped whole, brackets counted.
_JSON_TOKEN_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)
_CONTAINERS = (Mapping, list, tuple, set, frozenset, BaseModel)
_SCALARS = frozenset({int, float, str, bytes, bool, type(None)})  # never containers: skipped without isinstance


def too_deep(label: str) -> ValidationError:
    return ValidationError(f"{label}: nested deeper than {MAX_DEPTH} levels")


def json_too_deep_at(text: str, limit: int = MAX_DEPTH) -> int | None:
    """The offset of the first bracket of JSON text beyond `limit`, or None (a scan: no parsing, no recursion)."""
    depth = 0
    for match in _JSON_TOKEN_RE.finditer(text):
        char = match.group()
        if char in "[{":
            depth += 1
            if depth > limit:
                return match.start()
        elif char in "]}":
            depth -= 1
    return None


def line_and_column(text: str, offset: int) -> tuple[int, int]:
    """1-based line and column of `offset`, as `json` reports them."""
    return text.count("\n", 0, offset) + 1, offset - text.rfind("\n", 0, offset)


def check_json_text(text: str, label: str, *, values_inside: bool = False) -> None:
    """Raise ValidationError when JSON text nests deeper than MAX_DEPTH (before `json.loads`, which recurses).

    `values_inside`: the text is an object holding values each checked on its own (an inputs file, whose
    values are inputs): its own braces do not count, so a file holds what `--input` accepts.
    """
    if json_too_deep_at(text, MAX_DEPTH + 1 if values_inside else MAX_DEPTH) is not None:
        raise too_deep(label)


def _children(value: Any) -> Iterable[tuple[Any, Any]]:
    """(key, child) pairs of a container; keys that are containers themselves (tuples) count as children."""
    if isinstance(value, Mapping):
        keys = [(key, key) for key in value if isinstance(key, _CONTAINERS)]
        return [*value.items(), *keys]
    if isinstance(value, BaseModel):
        return vars(value).items()
    return enumerate(value)


def problem_in(value: Any) -> tuple[tuple[Any, ...], str] | None:
    """(path, problem) for the first place `value` nests deeper than MAX_DEPTH or contains itself, else None.

    `path` is the first PATH_KEPT keys/indexes leading there. An iterative depth-first walk: `on_path` holds
    the containers between the root and the current one, so a value shared by two branches is fine and a
    value inside itself is caught at once. Dicts, lists, tuples, sets and pydantic models are walked.
    """
    if type(value) is dict:
        if _SCALARS.issuperset(map(type, value.values())) and _SCALARS.issuperset(map(type, value)):
            return None  # a flat record, the common input: nothing to walk (both checks loop in C)
    elif not isinstance(value, _CONTAINERS):
        return None
    on_path: set[int] = set()
    stack: list[tuple[Any, int, tuple[Any, ...], bool]] = [(value, 1, (), False)]
    while stack:
        current, depth, path, leaving = stack.pop()
        if leaving:
            on_path.discard(id(current))
            continue
        if depth > MAX_DEPTH:
            return path, f"nested deeper than {MAX_DEPTH} levels"
        if id(current) in on_path:
            return path, "a value contains itself"
        on_path.add(id(current))
        stack.append((current, depth, path, True))
        # Only containers are kept (a list of a million numbers costs no million pairs); reversed, so the
        # first child is walked first.
        inner = [(k, c) for k, c in _children(current) if type(c) not in _SCALARS and isinstance(c, _CONTAINERS)]
        for key, child in reversed(inner):
            stack.append((child, depth + 1, (*path, key) if len(path) < PATH_KEPT else path, False))
    return None


def check_value(value: Any, label: str) -> None:
    """Raise ValidationError naming `label` when `value` nests deeper than MAX_DEPTH or contains itself."""
    found = problem_in(value)
    if found is not None:
        raise ValidationError(f"{label}: {found[1]}")
