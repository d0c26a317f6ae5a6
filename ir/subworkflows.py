"""Sub-workflows: a `workflow` node runs another workflow on a store of its own.

`ir.load` includes them. Every `workflow` node's `params.workflow` — a path (relative to the file of the
workflow naming it, or to the cwd when that one was not read from a file) or an inline workflow object — is
validated like a top-level workflow, with the same node types, and replaced by its validated IR
(`Workflow.wire()`): a loaded workflow is self-contained and travels to workers that do not have the files.
The file a path named is kept in `params.source`, for messages.

A problem inside a sub-workflow file names that file, its location and the node that includes it
(`sub.json: nodes[0] (id 'x').type: ... (from wf.json node 'call')`); a problem inside an inline one is a
location in the file holding it. A file that includes itself, directly or through others, is one problem
naming the chain.

Templates inside `params.workflow` are the sub-workflow's own: the parent neither checks them
(`is_sub_param`) nor resolves them (`ir.templates.is_workflow_document`). `params.inputs` is the parent's:
an object of values and templates, or one template resolving to an object, whose keys are the inputs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ir.errors import ValidationError, shown, shown_key
from ir.inputs import unknown_input
from ir.models import NodeSpec, Workflow
from ir.templates import TEMPLATE_RE, is_single_template

#: The node type that runs a sub-workflow.
NODE_TYPE = "workflow"
#: Its params: the sub-workflow, its inputs, and the file it was read from (set by `ir.load`).
WORKFLOW, INPUTS, SOURCE = "workflow", "inputs", "source"
#: The params that belong to the sub-workflow: their templates are not the parent's.
SUB_PARAMS = (WORKFLOW, SOURCE)
#: Most sub-workflows one load includes, counting each inclusion (a file included twice counts twice).
MAX_INCLUDED = 1000
_SHAPE = "must be a path to a workflow file or a workflow object"
_INPUTS_SHAPE = "must be an object of inputs or one template like '${record}'"


def is_sub_param(node: NodeSpec, name: str) -> bool:
    """Whether `params[name]` of `node` belongs to its sub-workflow (not a template scope of the parent)."""
    return node.type == NODE_TYPE and name in SUB_PARAMS


@dataclass
class Loading:
    """One `ir.load` call, shared by every document it reads: the problems found and the inclusions left."""

    problems: list[tuple[bool, str]] = field(default_factory=list)  # (in another file than the top one, text)
    left: int = MAX_INCLUDED


@dataclass(frozen=True)
class Document:
    """A workflow being loaded: the file it is written in, where its relative paths start, who includes it."""

    label: str | None  # the file, as messages name it (None: not read from a file)
    base: Path  # the directory a relative sub-workflow path starts from
    loading: Loading
    files: tuple[tuple[Path, str], ...] = ()  # the files being loaded around it, outermost first (recursion)
    chain: tuple[str, ...] = ()  # "wf.json node 'call'" for each file that includes it, innermost first
    nodes: tuple[str, ...] = ()  # an inline document: the `workflow` nodes of its file it sits in
    prefix: str = ""  # an inline document: its location in its file

    @classmethod
    def top(cls, label: str | None, path: Path | None) -> Document:
        if path is None:
            return cls(label, Path(), Loading())
        return cls(label, path.parent, Loading(), ((_resolved(path), label or str(path)),))

    def name(self, text: str) -> str:
        """A problem or warning of this document as the top workflow's load reports it.

        The top file's own are located in it (its name is the error's `source`); another file's name that
        file and the nodes that include it."""
        if not self.chain:
            return self.prefix + text
        return f"{self.label}: {self.prefix}{text} (from {', from '.join(self.chain)})"

    def problem(self, text: str) -> None:
        self.loading.problems.append((bool(self.chain), self.name(text)))

    def included_by(self, node_id: str) -> str:
        """How an included file names the node that includes it: `wf.json node 'call'`."""
        path = " > ".join(f"'{n}'" for n in (*self.nodes, node_id))
        return f"{self.label} node {path}" if self.label else f"node {path}"

    def file(self, label: str, path: Path, resolved: Path, node_id: str) -> Document:
        """The document of a file that node `node_id` of this one includes."""
        chain = (self.included_by(node_id), *self.chain)
        return Document(label, path.parent, self.loading, (*self.files, (resolved, label)), chain)

    def inline(self, where: str, node_id: str) -> Document:
        """The document of an inline sub-workflow of node `node_id` (at `where` in this one)."""
        prefix = f"{self.prefix}{where}.workflow: "
        return Document(self.label, self.base, self.loading, self.files, self.chain, (*self.nodes, node_id), prefix)


#: `ir.loader`'s load of one document: (raw, document, node types) -> the workflow, or None after problems.
Loader = Callable[[Any, Document, "Collection[str] | None"], "Workflow | None"]
#: `ir.loader`'s file reader: path -> (raw, label); a ValidationError when it cannot be read or parsed.
Reader = Callable[[Path], "tuple[Any, str]"]


def include(
    workflow: Workflow, doc: Document, node_types: Collection[str] | None, *, load: Loader, read: Reader
) -> None:
    """Validate every `workflow` node's sub-workflow and put its validated IR in its place; problems go to `doc`."""
    for i, node in enumerate(workflow.nodes):
        if node.type == NODE_TYPE:
            sub = _sub_workflow(node, f"nodes[{i}] (id '{node.id}').params", doc, node_types, load, read)
            if sub is not None:
                workflow.warnings.extend(sub.warnings)  # named by the sub-workflow's document already


def _sub_workflow(
    node: NodeSpec, where: str, doc: Document, node_types: Collection[str] | None, load: Loader, read: Reader
) -> Workflow | None:
    params = node.params
    for name in params:
        if name not in (WORKFLOW, INPUTS, SOURCE):
            doc.problem(
                f"{where}.{shown_key(name)}: unknown param of a workflow node (it takes 'workflow' and 'inputs')"
            )
    value = params.get(WORKFLOW)
    if value is None or value == "":
        doc.problem(f"{where}.workflow is required: a path to a workflow file, or a workflow object")
        return None
    if not isinstance(value, str | Mapping):
        doc.problem(f"{where}.workflow: {_SHAPE}, got {type(value).__name__}")
        return None
    doc.loading.left -= 1
    if doc.loading.left < 0:
        if doc.loading.left == -1:  # said once
            doc.problem(f"{where}.workflow: more than {MAX_INCLUDED} sub-workflows included in one workflow")
        return None
    before = len(doc.loading.problems)
    if isinstance(value, str):
        sub, source = _from_file(value, node.id, where, doc, node_types, load, read)
    else:
        sub, source = _inline(dict(value), node, where, doc, node_types, load)
    if sub is None or len(doc.loading.problems) > before:
        return None
    _check_inputs(params.get(INPUTS), sub, where, doc)
    params[WORKFLOW] = sub.wire()
    if source is not None:
        params[SOURCE] = source
    return sub


def _from_file(
    value: str,
    node_id: str,
    where: str,
    doc: Document,
    node_types: Collection[str] | None,
    load: Loader,
    read: Reader,
) -> tuple[Workflow | None, str | None]:
    if TEMPLATE_RE.search(value):
        doc.problem(
            f"{where}.workflow: a path cannot hold templates ({shown(value)}): sub-workflows are included "
            "when the workflow is loaded"
        )
        return None, None
    path = doc.base / value
    resolved = _resolved(path)
    seen = [file for file, _ in doc.files]
    if resolved in seen:
        labels = [label for _, label in doc.files[seen.index(resolved) :]]
        doc.problem(
            f"{where}.workflow: sub-workflow recursion {' -> '.join([*labels, labels[0]])}: "
            "a workflow cannot run itself, directly or through its sub-workflows"
        )
        return None, None
    try:
        raw, label = read(path)
    except ValidationError as exc:
        doc.problem(f"{where}.workflow: {exc}")
        return None, None
    return load(raw, doc.file(label, path, resolved, node_id), node_types), label


def _inline(
    value: dict[str, Any],
    node: NodeSpec,
    where: str,
    doc: Document,
    node_types: Collection[str] | None,
    load: Loader,
) -> tuple[Workflow | None, str | None]:
    """An inline sub-workflow's problems are locations in the file holding it. One read from a file earlier
    (a loaded workflow's IR loaded again: `params.source` names the file) is named by that file."""
    source = node.params.get(SOURCE)
    if isinstance(source, str) and source:
        sub_doc = Document(source, doc.base, doc.loading, doc.files, (doc.included_by(node.id), *doc.chain))
        return load(value, sub_doc, node_types), source
    return load(value, doc.inline(where, node.id), node_types), None


def _check_inputs(inputs: Any, sub: Workflow, where: str, doc: Document) -> None:
    """`params.inputs` against the sub-workflow's declared inputs, as far as it is known before the run."""
    if inputs is None:
        inputs = {}
    if isinstance(inputs, str):
        if not is_single_template(inputs):
            doc.problem(f"{where}.inputs: {_INPUTS_SHAPE}, got {shown(inputs)}")
        return  # its keys are known at run time only
    if not isinstance(inputs, Mapping):
        doc.problem(f"{where}.inputs: {_INPUTS_SHAPE}, got {type(inputs).__name__}")
        return
    for name in inputs:
        problem = unknown_input(sub, str(name))
        if problem:
            doc.problem(f"{where}.inputs: {problem}")
    for name, spec in (sub.inputs or {}).items():
        if spec.required and spec.default is None and name not in inputs:
            doc.problem(f"{where}.inputs: required input '{name}' of the sub-workflow is not given")


def _resolved(path: Path) -> Path:
    """The file a path names, to recognise it under another spelling (a symlink, `./`, `..`)."""
    try:
        return Path(os.path.realpath(path))
    except (OSError, ValueError):
        return Path(os.path.abspath(path))
