"""`${...}` templates: parsing once, resolving per run.

A value that is exactly one template keeps the referenced value's type; text around templates makes a
string (dicts and lists are rendered as JSON). Paths: `${name}`, `${node.key}`, `${node.key[0].field}`.
Params are compiled once per node so resolving an item costs a few dict lookups, not a regex scan.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ir.errors import TemplateError
from ir.names import SEGMENT as _SEGMENT

#: Longer list indexes are an error, not a number (Python refuses to convert 4,300+ digits).
MAX_INDEX_DIGITS = 18
TEMPLATE_RE = re.compile(r"\$\{\s*(" + _SEGMENT + r"(?:\." + _SEGMENT + r"|\[\d+\])*)\s*\}")
_PATH_PART_RE = re.compile(r"\.?(" + _SEGMENT + r")|\[(\d+)\]")
#: What `lookup` returns for a path the context does not hold (None is a value).
MISSING = object()


@dataclass(frozen=True, slots=True)
class Reference:
    """One `${...}` occurrence: its text and its path (str keys and int indexes)."""

    text: str
    path: tuple[str | int, ...]

    @property
    def root(self) -> str:
        return str(self.path[0])

    @property
    def shown(self) -> str:
        """The text, cut short for a message."""
        return shown_template(self.text)


def shown_template(text: str) -> str:
    """A template's text for a message: as written, or its start and `...}` when long."""
    return text if len(text) <= 40 else text[:30] + "...}"


def parse_path(expr: str) -> tuple[str | int, ...]:
    """`node.key[0]` -> ('node', 'key', 0); TemplateError for an index no list can have."""
    parts: list[str | int] = []
    for name, index in _PATH_PART_RE.findall(expr):
        if not name and len(index) > MAX_INDEX_DIGITS:
            raise TemplateError(f"list index with {len(index)} digits is too large")
        parts.append(name or int(index))
    return tuple(parts)


def _reference(text: str, expr: str) -> Reference:
    try:
        return Reference(text, parse_path(expr))
    except TemplateError as exc:
        raise TemplateError(f"{shown_template(text)}: {exc}") from None


def references(value: Any) -> list[Reference]:
    """Every template reference inside a param value (walks dicts and lists)."""
    found: list[Reference] = []
    if isinstance(value, str):
        found.extend(_reference(m.group(0), m.group(1)) for m in TEMPLATE_RE.finditer(value))
    elif isinstance(value, Mapping):
        for v in value.values():
            found.extend(references(v))
    elif isinstance(value, list | tuple):
        for v in value:
            found.extend(references(v))
    return found


def is_single_template(text: str) -> bool:
    m = TEMPLATE_RE.fullmatch(text.strip()) if isinstance(text, str) else None
    return m is not None


def lookup(context: Mapping[str, Any], path: tuple[str | int, ...]) -> Any:
    """Walk `path` through `context`; returns the MISSING sentinel when absent."""
    get = getattr(context, "get", None)
    value: Any = MISSING if get is None else get(path[0], MISSING)
    for part in path[1:]:
        if value.__class__ is dict and part.__class__ is str:  # the common step (`${node.key}`), checked first
            value = value.get(part, MISSING)
        elif value is MISSING:
            return MISSING
        elif isinstance(part, int):
            value = value[part] if isinstance(value, list | tuple) and -len(value) <= part < len(value) else MISSING
        elif isinstance(value, Mapping):
            value = value.get(part, MISSING)
        elif part.startswith("_") or isinstance(value, str | int | float):
            value = MISSING  # no private attributes of objects, no attributes of scalars
        else:
            value = getattr(value, part, MISSING)
    return value


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, default=str)
    if value is None:
        return ""
    return str(value)


class _Resolver:
    """A compiled param value. `resolve(context, where)` returns the value with templates filled in."""

    __slots__ = ("kind", "payload")

    def __init__(self, kind: str, payload: Any):
        self.kind, self.payload = kind, payload

    def resolve(self, context: Mapping[str, Any], where: str) -> Any:
        kind, payload = self.kind, self.payload
        if kind == "const":
            return payload
        if kind == "ref":
            return _value(context, payload, where)
        if kind == "text":
            return "".join(p if isinstance(p, str) else _render(_value(context, p, where)) for p in payload)
        if kind == "dict":  # a one-template entry looked up here: its label is made only for a miss's error
            resolved = {}
            for key, r in payload.items():
                value = lookup(context, r.payload.path) if r.kind == "ref" else MISSING
                resolved[key] = value if value is not MISSING else r.resolve(context, f"{where}.{key}")
            return resolved
        return [r.resolve(context, f"{where}[{i}]") for i, r in enumerate(payload)]


def _value(context: Mapping[str, Any], ref: Reference, where: str) -> Any:
    value = lookup(context, ref.path)
    if value is MISSING:
        keys = sorted(k for k in context if isinstance(k, str) and not k.startswith("__"))
        raise TemplateError(
            f"{where}: cannot resolve {ref.text}: '{'.'.join(map(str, ref.path))}' not found "
            f"(available keys: {', '.join(keys) or 'none'})"
        )
    return value


def compile_value(value: Any) -> _Resolver:
    """Compile a param value once; constants (no templates anywhere) resolve to themselves for free."""
    if isinstance(value, str):
        matches = list(TEMPLATE_RE.finditer(value))
        if not matches:
            return _Resolver("const", value)
        if len(matches) == 1 and matches[0].group(0) == value.strip() and value == value.strip():
            return _Resolver("ref", _reference(value, matches[0].group(1)))
        parts: list[Any] = []
        pos = 0
        for m in matches:
            if m.start() > pos:
                parts.append(value[pos : m.start()])
            parts.append(_reference(m.group(0), m.group(1)))
            pos = m.end()
        if pos < len(value):
            parts.append(value[pos:])
        return _Resolver("text", parts)
    if isinstance(value, dict):
        compiled = {k: compile_value(v) for k, v in value.items()}
        if all(r.kind == "const" for r in compiled.values()):
            return _Resolver("const", value)
        return _Resolver("dict", compiled)
    if isinstance(value, list):
        compiled_list = [compile_value(v) for v in value]
        if all(r.kind == "const" for r in compiled_list):
            return _Resolver("const", value)
        return _Resolver("list", compiled_list)
    return _Resolver("const", value)


def is_workflow_document(value: Any) -> bool:
    """Whether a param value is a whole workflow's IR (a `workflow` node's sub-workflow, as `ir.load` leaves it):
    its templates are that workflow's own, resolved against its store when it runs, never against the store of
    the node holding it."""
    return isinstance(value, Mapping) and "ir_version" in value and isinstance(value.get("nodes"), list)


class CompiledParams:
    """A node's params compiled once. Resolving copies nothing when no param has a template.

    A param that is a workflow document (`is_workflow_document`) is a constant."""

    __slots__ = ("_constant", "_dynamic", "node_id")

    def __init__(self, params: Mapping[str, Any], node_id: str):
        self.node_id = node_id
        self._constant: dict[str, Any] = {}
        self._dynamic: dict[str, tuple[_Resolver, str]] = {}  # with the label its errors name, made once
        for name, value in params.items():
            resolver = _Resolver("const", value) if is_workflow_document(value) else compile_value(value)
            if resolver.kind == "const":
                self._constant[name] = value
            else:
                self._dynamic[name] = (resolver, f"node '{node_id}' param '{name}'")

    @property
    def has_templates(self) -> bool:
        return bool(self._dynamic)

    def resolve(self, context: Mapping[str, Any]) -> dict[str, Any]:
        if not self._dynamic:
            return dict(self._constant)
        resolved = dict(self._constant)
        for name, (resolver, where) in self._dynamic.items():
            # Most params are one template: looked up here, one call less per param (a miss raises in resolve).
            value = lookup(context, resolver.payload.path) if resolver.kind == "ref" else MISSING
            resolved[name] = value if value is not MISSING else resolver.resolve(context, where)
        return resolved


def resolve_template(text: str, context: Mapping[str, Any], where: str) -> Any:
    """Resolve one template string (e.g. `batch.items`, a workflow output) against `context`."""
    resolver = _compiled_text(text)
    value = lookup(context, resolver.payload.path) if resolver.kind == "ref" else MISSING  # as CompiledParams
    return value if value is not MISSING else resolver.resolve(context, where)


def template_resolver(text: str, where: str) -> Callable[[Mapping[str, Any]], Any]:
    """`resolve_template(text, context, where)` as a callable compiled once, for a template resolved per record."""
    resolver = _compiled_text(text)
    if resolver.kind != "ref":
        return functools.partial(_resolve_at, resolver, where)
    path = resolver.payload.path

    def resolve(context: Mapping[str, Any]) -> Any:
        value = lookup(context, path)
        return value if value is not MISSING else resolver.resolve(context, where)

    return resolve


def _resolve_at(resolver: _Resolver, where: str, context: Mapping[str, Any]) -> Any:
    return resolver.resolve(context, where)


@functools.lru_cache(maxsize=1024)
def _compiled_text(text: str) -> _Resolver:
    """Compiled once per text: a dataset job resolves the same outputs for every record."""
    return compile_value(text)
