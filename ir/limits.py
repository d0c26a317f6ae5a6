"""Nesting limits: checked before anything recurses, so deep input is a clear error, never a RecursionError.

One limit serves workflow documents, inputs files and store values: the IR's own code (templates,
validation, the snapshot codec) walks values recursively, and Python's stack allows about 1,000 frames.
"""

from __future__ import annotations

from typing import Any

from ir.errors import ValidationError

#: The deepest nesting of objects/arrays accepted anywhere (workflow JSON, inputs, params).
MAX_DEPTH = 100


def too_deep(label: str) -> ValidationError:
    return ValidationError(f"{label}: nested deeper than {MAX_DEPTH} levels")


def check_json_text(text: str, label: str) -> None:
    """Raise ValidationError when JSON text nests deeper than MAX_DEPTH (a scan, no parsing, no recursion)."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise too_deep(label)
        elif char in "]}":
            depth -= 1


def check_value(value: Any, label: str) -> None:
    """Raise ValidationError when dicts/lists/tuples nest deeper than MAX_DEPTH or contain themselves.

    An iterative depth-first walk: `on_path` holds the containers between the root and the current one,
    so a value shared by two branches is fine and a value inside itself is caught at once.
    """
    if not isinstance(value, dict | list | tuple):
        return
    on_path: set[int] = set()
    stack: list[tuple[Any, int, bool]] = [(value, 1, False)]
    while stack:
        current, depth, leaving = stack.pop()
        if leaving:
            on_path.discard(id(current))
            continue
        if depth > MAX_DEPTH:
            raise too_deep(label)
        if id(current) in on_path:
            raise ValidationError(f"{label}: a value contains itself")
        on_path.add(id(current))
        stack.append((current, depth, True))
        children = current.values() if isinstance(current, dict) else current
        stack.extend((child, depth + 1, False) for child in children if isinstance(child, dict | list | tuple))
