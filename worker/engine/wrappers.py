"""The wrappers every compiled node wears, outermost first:
InstrumentedNode > [PflowBatchNode >] NamespacedNode > TemplateNode > the actual node.

Each exposes what it wraps as `.inner` and can `clone()` itself with fresh inner instances
(worker/batch/cloning.py says why), and compile itself with its inner chain into one callable per execution
(`compile_runner`, for worker/batch/cloning.py `runner`): each wrapper's step around its inner chain's runner.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from typing import Any

from pocketflow import BaseNode

from ir.errors import Outage
from ir.models import RateLimitSpec
from ir.templates import CompiledParams
from worker import redact
from worker.batch.cloning import clone_node, runner
from worker.engine import context, rate_limits
from worker.node_error import NodeError
from worker.store import NamespacedStore


class _Wrapper(BaseNode):
    def __init__(self, inner: BaseNode):
        super().__init__()
        self.inner = inner

    def clone(self) -> _Wrapper:
        twin = copy.copy(self)
        twin.inner = clone_node(self.inner)
        return twin

    def set_params(self, params: dict[str, Any]) -> None:
        """Flow-level params are ignored: a node's params come from the IR (and its templates)."""


class TemplateNode(_Wrapper):
    """Resolves the IR params' `${...}` templates against the store, then runs the node with them: each
    attempt admitted by the node's rate limit, and throttled calls waited out (worker/engine/rate_limits.py)."""

    def __init__(self, inner: BaseNode, params: CompiledParams, limit: RateLimitSpec | None = None):
        super().__init__(inner)
        self.compiled = params
        self.dynamic = params.has_templates
        self.limit = limit
        if not self.dynamic:
            inner.params = params.resolve({})

    def _run(self, shared: Any) -> Any:
        if self.dynamic:
            self.inner.params = self.compiled.resolve(shared)
        return rate_limits.call(self.inner, shared, self.limit)

    def compile_runner(self) -> Callable[[Any], Any]:
        node, call = self.inner, rate_limits.runner(self.inner, self.limit)
        if not self.dynamic:
            return call
        resolve = self.compiled.resolve

        def run(shared: Any) -> Any:
            node.params = resolve(shared)
            return call(shared)

        return run


class NamespacedNode(_Wrapper):
    """Gives the node a NamespacedStore view so its writes land in `shared[node_id]`."""

    def __init__(self, inner: BaseNode, node_id: str):
        super().__init__(inner)
        self.node_id = node_id

    def _run(self, shared: Any) -> Any:
        return self.inner._run(NamespacedStore(shared, self.node_id))

    def compile_runner(self) -> Callable[[Any], Any]:
        node_id, templated = self.node_id, self.inner
        if isinstance(templated, TemplateNode) and templated.dynamic:
            return _namespaced_templates(node_id, templated)
        inner = runner(templated)

        def run(shared: Any) -> Any:
            return inner(NamespacedStore(shared, node_id))

        return run


def _namespaced_templates(node_id: str, templated: TemplateNode) -> Callable[[Any], Any]:
    """NamespacedNode > TemplateNode compiled as one call (a sub-workflow's nodes run once per dataset record).
    Templates resolve against the store itself while the node's namespace is empty, as usual before it runs: the
    view would only read through to it, one Python-level `get` per template."""
    node, resolve = templated.inner, templated.compiled.resolve
    call = rate_limits.runner(node, templated.limit)

    def run(shared: Any) -> Any:
        view = NamespacedStore(shared, node_id)
        node.params = resolve(view if view.namespace else shared)
        return call(view)

    return run


class InstrumentedNode(_Wrapper):
    """Outermost: emits `state`/`error` events and routes failures to an `error` edge (errors as state).

    With an `error` successor, a node that raises (after its retries) yields a NodeError stored in
    `shared["_error"]` and the flow follows `error`; without one, the original exception propagates.
    """

    def __init__(self, inner: BaseNode, node_id: str):
        super().__init__(inner)
        self.node_id = node_id

    def actual(self) -> BaseNode:
        node = self.inner
        while hasattr(node, "inner"):  # the wrappers and PflowBatchNode
            node = node.inner
        return node

    def _run(self, shared: Any) -> Any:
        return self._around(self.inner._run, shared)

    def compile_runner(self) -> Callable[[Any], Any]:
        return functools.partial(self._around, runner(self.inner))

    def _around(self, inner: Callable[[Any], Any], shared: Any) -> Any:
        ctx = context.current()
        ctx.last_node = self.node_id
        if ctx.on_node_start is not None:
            ctx.on_node_start(self.node_id)
        try:
            action = inner(shared)
        except Outage:
            raise  # not the node's error: never routed to its `error` successor
        except Exception as raised:
            exc = redact.scrub_exception(raised, redact.node_secrets(self.inner, shared))  # no secret goes on
            if "error" not in self.successors:
                ctx.emit({"type": "error", "node": self.node_id, "error": f"{type(exc).__name__}: {exc}"})
                if exc is raised:
                    raise
                raise exc from None
            actual = self.actual()
            retries = getattr(actual, "cur_retry", 0) + 1
            shared["_error"] = NodeError.from_exception(exc, self.node_id, retries, getattr(actual, "max_retries", 1))
            action = "error"
        if ctx.sink is not None:  # a sub-workflow's run drops its events: no copy of its store for nobody
            ctx.sink({"type": "state", "node": self.node_id, "state": dict(shared)})
        return action
