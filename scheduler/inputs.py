"""A run's inputs: parsing `--input k=v` values, and checking them against the workflow's declared inputs
(`ir.inputs`, re-exported)."""

from __future__ import annotations

import json
from typing import Any

from ir.inputs import apply_inputs, unknown_input
from ir.limits import check_json_text


def parse_input_value(text: str, label: str = "--input") -> Any:
    """`--input k=v`: JSON when it parses (numbers, booleans, lists), otherwise the plain string.

    Nesting deeper than `ir.limits.MAX_DEPTH` is a ValidationError naming `label`, never a RecursionError.
    """
    check_json_text(text, label)
    try:
        return json.loads(text)
    except ValueError:
        return text


# One rule for every run's inputs, top-level here and a sub-workflow's on a worker: it lives in `ir`.
__all__ = ["apply_inputs", "parse_input_value", "unknown_input"]
