"""Copies of compiled nodes for concurrent use.

pocketflow 0.0.3 keeps params and retry state (`cur_retry`) on node instances, so two items running at
once need two instances. Wrappers clone their whole inner chain.
"""

from __future__ import annotations

import copy

from pocketflow import BaseNode


def clone_node(node: BaseNode) -> BaseNode:
    """A copy with its own params and retry state."""
    if hasattr(node, "clone"):
        return node.clone()
    twin = copy.copy(node)
    twin.params = dict(node.params)
    return twin
