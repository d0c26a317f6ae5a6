"""Build one node's wrapper chain from its IR spec. Used by the compiler and by workers."""

from __future__ import annotations

from pocketflow import BaseNode

from ir.models import NodeSpec
from ir.templates import CompiledParams
from worker.engine.batch_node import PflowBatchNode
from worker.engine.wrappers import InstrumentedNode, NamespacedNode, TemplateNode
from worker.nodes import registry


def actual_node(spec: NodeSpec) -> BaseNode:
    cls = registry.get(spec.type)
    node = cls()
    if hasattr(node, "max_retries"):
        node.max_retries, node.wait = spec.max_retries, spec.wait
    return node


def item_chain(spec: NodeSpec) -> NamespacedNode:
    """NamespacedNode > TemplateNode > actual node: what runs for one item (or a plain node)."""
    return NamespacedNode(
        TemplateNode(actual_node(spec), CompiledParams(spec.params, spec.id), spec.rate_limit), spec.id
    )


def batch_node(spec: NodeSpec) -> PflowBatchNode:
    return PflowBatchNode(item_chain(spec), spec)


def build_chain(spec: NodeSpec) -> InstrumentedNode:
    inner: BaseNode = batch_node(spec) if spec.batch else item_chain(spec)
    return InstrumentedNode(inner, spec.id)
