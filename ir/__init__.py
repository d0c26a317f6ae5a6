"""The workflow IR: models, loading and static checks, templates, and the snapshot codec.

`ir` imports nothing from `worker` or `scheduler`. Its names are imported when first asked for: a command that
only reads a run's rows (`results`, `wait`) imports `ir.errors` without the models and pydantic behind them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ir.errors import TemplateError, ValidationError
    from ir.loader import load
    from ir.models import BatchSpec, EdgeSpec, NodeSpec, Workflow, json_schema

#: name -> the module that defines it
_HOMES = {
    "TemplateError": "ir.errors",
    "ValidationError": "ir.errors",
    "load": "ir.loader",
    "BatchSpec": "ir.models",
    "EdgeSpec": "ir.models",
    "NodeSpec": "ir.models",
    "Workflow": "ir.models",
    "json_schema": "ir.models",
}

__all__ = ["BatchSpec", "EdgeSpec", "NodeSpec", "TemplateError", "ValidationError", "Workflow", "json_schema", "load"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'ir' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
