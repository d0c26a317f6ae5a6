"""`ir.load`: dict, JSON text or path -> validated `Workflow`, or one ValidationError listing every problem."""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import pydantic

from ir import checks, limits, subworkflows
from ir.errors import ValidationError, shown
from ir.models import BAD_NAMES, Workflow
from ir.names import is_name

#: A source string longer than this is shown shortened in messages.
MAX_SHOWN_SOURCE = 80
#: Linux's limits on one file name and a whole path: a longer text cannot be a path.
NAME_MAX, PATH_MAX = 255, 4096
#: A key longer than this is shown shortened in a location.
MAX_SHOWN_KEY = 40


def _read(source: Any) -> tuple[Any, str | None, Path | None]:
    """Returns (raw data, a label naming where it came from, the file it was read from).

    Every failure is one ValidationError."""
    if isinstance(source, Workflow | Mapping):
        _check_depth(source)  # before anything walks it: `wire()` and the checks recurse
        raw = source.wire() if isinstance(source, Workflow) else dict(source)
        return _listed(raw), None, None
    if isinstance(source, bytes | bytearray | memoryview):  # bytes are the document itself, never a path
        return _parse_json(_decode(bytes(source), "workflow JSON"), "workflow JSON"), None, None
    if isinstance(source, str) and not source.strip():
        raise ValidationError("the workflow source is empty text; pass a dict, JSON text or a path")
    if isinstance(source, str) and source.lstrip().startswith(("{", "[")):
        return _parse_json(source, "workflow JSON"), None, None
    if isinstance(source, str | os.PathLike):
        raw, label = _read_file(source)
        return raw, label, Path(os.fsdecode(source))
    raise ValidationError(f"cannot load a workflow from {type(source).__name__}; pass a dict, JSON text or a path")


def declare_given(raw: Any, names: Collection[str]) -> Any:
    """`raw` with the input names a run is given declared (`given`, not required), when it declares no inputs.

    Such a workflow takes any input, so a template naming one is a known input (not "unknown node or input",
    with a did-you-mean on a node's id); and as the run records the workflow so declared, every later load of
    it (a resume, a worker's advance, `results`) knows them too. It still counts as declaring no inputs
    (`Workflow.declares_inputs`): any other name is taken, and a template naming no node or input is left to
    the run (a key of `shared=`) unless it looks like a misspelt one. A name that cannot be an input name (which
    no template can name) is left out. A workflow that declares inputs is as it was."""
    declared = {name: {"required": False, "given": True} for name in names if isinstance(name, str) and is_name(name)}
    before = raw.get("inputs") if isinstance(raw, dict) else None
    if not declared or not isinstance(raw, dict) or not (before is None or _all_given(before)):
        return raw
    return {**raw, "inputs": {**declared, **(before or {})}}


def given_inputs(raw: dict[str, Any]) -> list[str]:
    """The inputs `declare_given` declared in a run's recorded workflow: an edited workflow the run goes on
    under (`resume --workflow`, a repair) is loaded knowing them too."""
    inputs = raw.get("inputs")
    return [name for name, spec in inputs.items() if isinstance(spec, dict) and spec.get("given")] if inputs else []


def _all_given(inputs: Any) -> bool:
    """Whether raw `inputs` hold only inputs declared by `declare_given` (a run's workflow loaded again)."""
    specs = inputs.values() if isinstance(inputs, dict) else ()
    return bool(specs) and all(isinstance(spec, dict) and spec.get("given") for spec in specs)


def _check_depth(source: Mapping[str, Any] | Workflow) -> None:
    found = limits.problem_in(source)
    if found is not None:
        path, problem = found
        raise ValidationError(f"{_location(path, source)}: {problem}")


def _listed(raw: dict[str, Any]) -> dict[str, Any]:
    """`nodes`/`edges` given as another iterable (a generator, a deque) as lists, so the depth check saw them."""
    for key in ("nodes", "edges"):
        value = raw.get(key)
        if isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping | list | tuple):
            raw[key] = list(value)
            _check_depth({key: raw[key]})
    return raw


def _label(text: str) -> str:
    """How a path is named in messages: whole when it could be a path on this system (every name at most NAME_MAX
    characters, all of it at most PATH_MAX: a file deep in directories is still the user's file), else cut to
    MAX_SHOWN_SOURCE characters (a long text given where a path was expected is not echoed back)."""
    names_fit = all(len(name) <= NAME_MAX for name in text.split(os.sep))
    if text.isprintable() and (len(text) <= MAX_SHOWN_SOURCE or (len(text) <= PATH_MAX and names_fit)):
        return text
    return repr(text[:MAX_SHOWN_SOURCE]) + ("..." if len(text) > MAX_SHOWN_SOURCE else "")


def _read_file(source: str | os.PathLike[str]) -> tuple[Any, str]:
    try:
        text = os.fsdecode(source)
    except TypeError as exc:  # a PathLike whose __fspath__ returns neither str nor bytes
        raise ValidationError(f"cannot read a workflow from {type(source).__name__}: {exc}") from None
    label = _label(text)
    path = Path(text)
    try:
        found, is_dir = path.exists(), path.is_dir()
        data = path.read_bytes() if found and not is_dir else b""
    except (OSError, ValueError) as exc:  # e.g. "File name too long", "embedded null byte", no permission
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValidationError(f"cannot read {label}: {reason}") from None
    if not found:
        raise ValidationError(f"{label}: file not found")
    if is_dir:
        raise ValidationError(f"{label}: is a directory, expected a workflow JSON file")
    if not data.strip():
        raise ValidationError(f"{label}: the file is empty, expected a workflow JSON object")
    text = _decode(data, label)
    if path.suffix.lower() in (".yaml", ".yml") and not text.lstrip().startswith("{"):
        raise ValidationError(f"{label}: workflows are JSON, not YAML")
    return _parse_json(text, label), label


def _decode(data: bytes, label: str) -> str:
    body = data.removeprefix(codecs.BOM_UTF8)  # some editors start UTF-8 files with one
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        byte = exc.start + len(data) - len(body)
        raise ValidationError(f"{label}: not UTF-8 text (byte {byte}: {exc.reason})") from None


def _parse_json(text: str, label: str) -> Any:
    deep_at = limits.json_too_deep_at(text)  # before json.loads, which recurses
    if deep_at is not None:
        line, column = limits.line_and_column(text, deep_at)
        raise ValidationError(f"{label}: nested deeper than {limits.MAX_DEPTH} levels at line {line}, column {column}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{label}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise ValidationError(f"{label}: invalid JSON: {exc}") from None


def _bad_names(raw: dict[str, Any]) -> set[str]:
    """Node ids and input names that are strings but not valid names (templates using them are not re-reported)."""
    nodes = raw.get("nodes") if isinstance(raw.get("nodes"), list) else []
    names = [node.get("id") for node in nodes if isinstance(node, dict)]
    names += list(raw["inputs"]) if isinstance(raw.get("inputs"), dict) else []
    return {name for name in names if isinstance(name, str) and name and not is_name(name)}


def _node_id(raw: Any, index: int) -> str | None:
    nodes = raw.get("nodes") if isinstance(raw, Mapping) else getattr(raw, "nodes", None)
    node = nodes[index] if isinstance(nodes, list | tuple) and 0 <= index < len(nodes) else None
    node_id = node.get("id") if isinstance(node, Mapping) else getattr(node, "id", None)
    return node_id if isinstance(node_id, str) else None


def _part(part: Any) -> str:
    """One step of a location: `.name` for a string key, `[i]` for an index, `[repr]` for another key."""
    if isinstance(part, str):
        text = part if len(part) <= MAX_SHOWN_KEY else shown(part, MAX_SHOWN_KEY)
        return text if part == "[key]" else "." + text
    if isinstance(part, int) and not isinstance(part, bool):
        return f"[{part}]"
    try:
        text = repr(part)
    except Exception:  # a user's key whose repr fails still gets a location
        text = type(part).__name__
    return f"[{text[:MAX_SHOWN_KEY]}]"


def _location(loc: tuple[Any, ...], raw: Any) -> str:
    text = ""
    for i, part in enumerate(loc):
        text += _part(part)
        if i == 1 and loc[0] == "nodes" and isinstance(part, int) and loc[2:3] != ("id",):
            node_id = _node_id(raw, part)  # not when the id itself is the problem: its message names it
            text += f" (id {shown(node_id)})" if node_id is not None else ""
    return text.removeprefix(".") or "workflow"


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


def load(
    source: Any,
    *,
    node_types: Collection[str] | None = None,
    node_checks: Callable[[Workflow], Iterable[str]] | None = None,
    inputs: Collection[str] = (),
) -> Workflow:
    """Parse and statically check a workflow, and include its sub-workflows (ir/subworkflows.py).

    `source` is a dict, JSON text, a path or a Workflow. With `node_types`, unknown node types are
    reported too (the scheduler passes the registry's names; `ir` itself knows no node types but
    `workflow`); `node_checks` adds the node types' own problems (their params), reported with the rest.
    `inputs`: the names a run is given (`--input`, `inputs=`, the keys of `shared=`); a workflow that declares
    no inputs gets them declared (`declare_given`), so its templates may name them.
    What is suspicious but valid is returned in `workflow.warnings` (never serialized).
    """
    raw, label, path = _read(source)
    raw = declare_given(raw, inputs)
    doc = subworkflows.Document.top(label, path)
    workflow = _document(raw, doc, node_types, node_checks)
    if workflow is not None:
        _check_included_depth(workflow, doc)
    problems = doc.loading.problems
    if any(elsewhere for elsewhere, _ in problems):  # each problem names its file
        raise ValidationError([text if elsewhere or not label else f"{label}: {text}" for elsewhere, text in problems])
    if problems:
        raise ValidationError([text for _, text in problems], source=label)
    assert workflow is not None
    return workflow


def _document(
    raw: Any,
    doc: subworkflows.Document,
    node_types: Collection[str] | None,
    node_checks: Callable[[Workflow], Iterable[str]] | None = None,
) -> Workflow | None:
    """One workflow document (the top one or a sub-workflow): its problems go to `doc`; None when it has any.

    A document some fields of which are malformed is checked further without them, so one pass reports every
    problem (a bad batch field does not hide an unknown node type or a bad reference)."""
    before = len(doc.loading.problems)
    if not isinstance(raw, dict):
        doc.problem(f"the workflow must be a JSON object, got {type(raw).__name__}")
        return None
    context = {BAD_NAMES: _bad_names(raw)}
    try:
        workflow = Workflow.model_validate(raw, context=context)
    except pydantic.ValidationError as exc:
        for problem in _pydantic_problems(exc, raw):
            doc.problem(problem)
        salvaged = _without_malformed(raw, exc, context)
        if salvaged is None:
            return None
        workflow = salvaged
    for problem in (p for check in checks.ALL_CHECKS for p in check(workflow)):
        doc.problem(problem)
    if node_types is not None:
        for problem in checks.node_types(workflow, node_types):
            doc.problem(problem)
    subworkflows.include(workflow, doc, node_types, load=_document, read=_read_file)
    for problem in node_checks(workflow) if node_checks is not None else ():  # on the sub-workflows included
        doc.problem(problem)
    if len(doc.loading.problems) > before:
        return None
    workflow.warnings.extend(doc.name(w) for check in checks.ALL_WARNINGS for w in check(workflow))
    return workflow


#: Fields a node or an edge cannot be checked without: a malformed one stops the checks after pydantic's.
_ESSENTIAL = {"nodes": ("id", "type"), "edges": ("from", "to")}


def _without_malformed(raw: dict[str, Any], exc: pydantic.ValidationError, context: dict[str, Any]) -> Workflow | None:
    """The workflow without the fields pydantic refused (a node's `batch`, an edge's `fan_in`, a top-level
    `max_steps`), for the other checks to look at; None when what is malformed is a node's or an edge's
    identity or the lists themselves (the other checks would only report what follows from it)."""
    trimmed = dict(raw)
    for err in exc.errors():
        loc = err["loc"]
        if len(loc) == 1 and loc[0] not in _ESSENTIAL:
            trimmed.pop(str(loc[0]), None)
        elif len(loc) >= 3 and loc[0] in _ESSENTIAL and isinstance(loc[1], int) and loc[2] not in _ESSENTIAL[loc[0]]:
            items = trimmed[loc[0]] = list(trimmed[loc[0]])
            element = items[loc[1]] = dict(items[loc[1]])
            element.pop(loc[2], None)
        else:
            return None
    try:
        return Workflow.model_validate(trimmed, context=context)
    except pydantic.ValidationError:
        return None


def _check_included_depth(workflow: Workflow, doc: subworkflows.Document) -> None:
    """A workflow with its sub-workflows included must still load again from its IR (a run record, a worker)."""
    if any(node.type == subworkflows.NODE_TYPE for node in workflow.nodes):
        found = limits.problem_in(workflow.wire())
        if found is not None:
            doc.problem(f"{_location(found[0], workflow)}: {found[1]} once its sub-workflows are included")
