"""The workflow IR: models, loading and static checks, templates, and the snapshot codec.

`ir` imports nothing from `worker` or `scheduler`.
"""

from ir.errors import TemplateError, ValidationError
from ir.loader import load
from ir.models import BatchSpec, EdgeSpec, NodeSpec, Workflow, json_schema

__all__ = [
    "BatchSpec",
    "EdgeSpec",
    "NodeSpec",
    "TemplateError",
    "ValidationError",
    "Workflow",
    "json_schema",
    "load",
]
