"""Validation of one node param, shared by the built-in node types.

Every node type checks its params in prep and raises ValueError with the same wording ("<type>: param
'<name>' is required", "... must be a string, got int"); this module is that check written once, so
the node modules keep only what is specific to them (URL schemes, env var names, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DESCRIPTIONS: dict[type, str] = {
    str: "a string",
    dict: "a dict",
    list: "a list",
    bool: "a boolean",
    int: "a number",
    float: "a number",
}


def describe(kinds: tuple[type, ...]) -> str:
    """'a string', 'a number', 'a string or a list': what a value of one of `kinds` is called."""
    names = [DESCRIPTIONS.get(kind, f"a {kind.__name__}") for kind in kinds]
    return " or ".join(dict.fromkeys(names))


def param(
    node_type: str,
    params: dict[str, Any],
    name: str,
    kinds: type | tuple[type, ...],
    *,
    required: bool = False,
    default: Any = None,
    what: str | None = None,
    check: Callable[[Any], Any] | None = None,
    empty_is_missing: bool = False,
) -> Any:
    """`params[name]` checked to be one of `kinds`, or `default` when it is missing or None.

    A missing value raises instead when `required` (`empty_is_missing` also counts "" as missing).
    A boolean passes as a number only when `bool` is one of `kinds`. `check`, if given, must accept
    the value too; a failure shows the value itself, a wrong type only its type name. `what` replaces
    the description made from `kinds` ("a string", "a number", ...) in the error message.
    """
    value = params.get(name)
    if value is None or (empty_is_missing and value == ""):
        if required:
            raise ValueError(f"{node_type}: param '{name}' is required")
        return default
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and int in kinds and bool not in kinds):
        got = type(value).__name__
    elif check is not None and not check(value):
        got = repr(value)
    else:
        return value
    raise ValueError(f"{node_type}: param '{name}' must be {what or describe(kinds)}, got {got}")
