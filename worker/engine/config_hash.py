"""What a checkpoint knows about the node it records: a hash of the node's configuration and one of the
values it read, so a resume with an edited workflow can tell which completed nodes still hold.

- `config`: the node's type, ALL its params as written (templates included, a sub-workflow document
  too), its batch block (with defaults filled in) and its retries, as canonical JSON (sorted keys).
  `purpose` is documentation and does not count.
- `reads`: the values the node's templates point at when it starts (`${a.b}` -> the value at a.b; for a
  batch node, `batch.items` and the params not about the item), packed with the snapshot codec (msgpack:
  typed, in C, one pass) — the same values the TemplateNode resolves, without rendering text around them.
  A value the codec cannot pack counts by its type and repr: at worst a node looks changed, a change is
  never hidden.

Both are BLAKE2b digests (16 bytes, hex). The references of a node are found once per compiled flow.
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ir import snapshot, templates
from ir.errors import SnapshotError, TemplateError
from ir.models import NodeSpec
from ir.subworkflows import is_sub_param
from ir.templates import Reference, references

#: Digest size in bytes (32 hex characters).
DIGEST_SIZE = 16


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).hexdigest()


def config_hash(spec: NodeSpec) -> str:
    """The hash of what the IR says about a node (its `purpose` aside)."""
    batch = {k: _number(v) for k, v in spec.batch.model_dump(by_alias=True).items()} if spec.batch else None
    document = {
        "type": spec.type,
        "params": spec.params,  # as written: 1 and 1.0 may render differently in a node
        "batch": batch,
        "max_retries": spec.max_retries,
        "wait": _number(spec.wait),
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)
    return digest(text.encode("utf-8", "surrogatepass"))


def _number(value: Any) -> Any:
    """A schema number as one value whichever way it was written (`0` and `0.0` after a round trip)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def reads_of(spec: NodeSpec) -> list[Reference]:
    """The template references a node resolves against the store (a batch item's own are the items')."""
    alias = spec.batch.alias if spec.batch else None
    found: list[Reference] = []
    for name, value in spec.params.items():
        if is_sub_param(spec, name):  # a sub-workflow's templates are its own
            continue
        try:
            found += [ref for ref in references(value) if ref.root != alias]
        except TemplateError:
            continue  # validation refused it already; nothing to read
    if spec.batch and spec.batch.items:
        found += references(spec.batch.items)
    return found


def reads_hash(refs: list[Reference], store: Mapping[str, Any]) -> str:
    """The hash of the values `refs` point at in `store` now (a missing one counts as missing)."""
    if not refs:
        return ""
    values = [(ref.text, _value(store, ref)) for ref in refs]
    try:
        packed = snapshot.encode(values)
    except (SnapshotError, TypeError, ValueError, RecursionError):
        packed = repr([(text, type(v).__name__, repr(v)) for text, v in values]).encode("utf-8", "replace")
    return digest(packed)


def _value(store: Mapping[str, Any], ref: Reference) -> Any:
    value = templates.lookup(store, ref.path)
    return ["<missing>"] if value is templates.MISSING else value


@dataclass(frozen=True)
class NodeFacts:
    """A node's config hash and the references whose values make its reads hash."""

    config: str
    refs: list[Reference]

    def reads(self, store: Mapping[str, Any]) -> str:
        return reads_hash(self.refs, store)


_facts: weakref.WeakKeyDictionary[Any, dict[str, NodeFacts | None]] = weakref.WeakKeyDictionary()
_facts_lock = threading.Lock()  # parallel branches run nodes of one flow on several threads


def facts_of(flow: Any, node_id: str) -> NodeFacts | None:
    """The NodeFacts of a node of a compiled flow (None for what is not an IR node, e.g. a parallel
    section), computed once per flow."""
    with _facts_lock:
        known = _facts.setdefault(flow, {})
        if node_id not in known:
            try:
                spec = flow.workflow.node(node_id)
            except KeyError:
                spec = None
            known[node_id] = NodeFacts(config_hash(spec), reads_of(spec)) if spec is not None else None
        return known[node_id]
