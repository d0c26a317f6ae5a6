"""The one naming rule for what users name (node ids, inputs, outputs, batch aliases) and templates reach.

Python identifier rules, Unicode letters included (`données`), plus '-' inside a name (`fetch-page`).
A name must also be writable as a template path segment, so every valid name can be referenced as
`${name...}`: `SEGMENT` (a regex fragment) is what templates match, `is_name` what validation accepts.
"""

from __future__ import annotations

import re

from ir.errors import shown

#: A template path segment: a Unicode letter or '_', then word characters or '-'.
SEGMENT = r"[^\W\d][\w-]*"
_SEGMENT_RE = re.compile(SEGMENT)
_IDENTIFIER_RE = re.compile(r"[^\W\d]\w*")

#: How a bad name is explained, after "<what> 'x y' ".
NAME_RULE = "may contain only letters, digits, '_' and '-', and must not start with a digit or '-'"
IDENTIFIER_RULE = "may contain only letters, digits and '_', and must not start with a digit"


def is_name(value: object) -> bool:
    """A node id, input or output name: identifier characters plus '-', not first."""
    return (
        isinstance(value, str) and _SEGMENT_RE.fullmatch(value) is not None and value.replace("-", "_").isidentifier()
    )


def is_identifier(value: object) -> bool:
    """A batch alias: a Python identifier (no '-'), since items see it as a root key like an input."""
    return isinstance(value, str) and _IDENTIFIER_RE.fullmatch(value) is not None and value.isidentifier()


def name_problem(what: str, value: object) -> str | None:
    """'node id 'x y' may contain only ...' for a bad name, None for a good one."""
    if not isinstance(value, str):
        return f"{what} must be a string, got {type(value).__name__}"
    if not is_name(value):
        return f"{what} {shown(value)} {NAME_RULE}"
    return None
