"""A compiled node chain run many times: copies for concurrent use (`clone_node`) and one callable per
execution (`runner`).

pocketflow 0.0.3 keeps params and retry state (`cur_retry`) on node instances, so two items running at
once need two instances. Wrappers clone their whole inner chain.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from pocketflow import BaseNode


def clone_node(node: BaseNode) -> BaseNode:
    """A copy with its own params and retry state."""
    if hasattr(node, "clone"):
        return node.clone()
    twin = copy.copy(node)
    twin.params = dict(node.params)
    return twin


def runner(node: BaseNode) -> Callable[[Any], Any]:
    """`node._run` compiled once: a wrapper's `compile_runner()` (worker/engine/wrappers.py), else `_run` itself.

    A batch's items and a sub-workflow's records run one chain thousands of times; compiled, an execution is one
    call per wrapper and the node's own steps, not PocketFlow's `_run` > `_exec` per layer. The callable holds the
    chain's instances: a clone is compiled anew."""
    compile_ = getattr(node, "compile_runner", None)
    return compile_() if compile_ is not None else node._run
