"""`ir.load`: dict, JSON text or path -> validated `Workflow`, or one ValidationError listing every problem."""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import pydantic

from ir import checks
from ir.errors import ValidationError
from ir.models import Workflow


def _read(source: Any) -> tuple[Any, str | None]:
    """Returns (raw data, a label naming where it came from)."""
    if isinstance(source, Workflow):
        return source.wire(), None
    if isinstance(source, Mapping):
        return dict(source), None
    if isinstance(source, bytes):
        source = source.decode()
    if isinstance(source, str) and source.lstrip().startswith(("{", "[")):
        return _parse_json(source, "workflow JSON"), None
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.exists():
            raise ValidationError(f"{path}: file not found")
        if path.is_dir():
            raise ValidationError(f"{path}: is a directory, expected a workflow JSON file")
        return _parse_json(path.read_text(encoding="utf-8"), str(path)), str(path)
    raise ValidationError(f"cannot load a workflow from {type(source).__name__}; pass a dict, JSON text or a path")


def _parse_json(text: str, label: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{label}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


def _location(loc: tuple[Any, ...], raw: Any) -> str:
    text = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            text += f"[{part}]"
            if i == 1 and loc[0] == "nodes" and isinstance(raw, dict):
                node = (raw.get("nodes") or [None] * (part + 1))[part]
                if isinstance(node, dict) and isinstance(node.get("id"), str):
                    text += f" (id '{node['id']}')"
        else:
            text += ("." if text else "") + str(part)
    return text or "workflow"


def _pydantic_problems(exc: pydantic.ValidationError, raw: Any) -> list[str]:
    problems = []
    for err in exc.errors():
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "missing":
            message = "is required"
        elif err["type"] == "extra_forbidden":
            message = "unknown field"
        problems.append(f"{_location(err['loc'], raw)}: {message}")
    return problems


def load(source: Any, *, node_types: Collection[str] | None = None) -> Workflow:
    """Parse and statically check a workflow.

    `source` is a dict, JSON text, a path or a Workflow. With `node_types`, unknown node types are
    reported too (the scheduler passes the registry's names; `ir` itself knows no node types).
    """
    raw, label = _read(source)
    if not isinstance(raw, dict):
        raise ValidationError(f"the workflow must be a JSON object, got {type(raw).__name__}", source=label)
    try:
        workflow = Workflow.model_validate(raw)
    except pydantic.ValidationError as exc:
        raise ValidationError(_pydantic_problems(exc, raw), source=label) from None
    problems = [p for check in checks.ALL_CHECKS for p in check(workflow)]
    if node_types is not None:
        problems.extend(checks.node_types(workflow, node_types))
    if problems:
        raise ValidationError(problems, source=label)
    return workflow
