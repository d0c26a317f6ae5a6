"""PflowBatchNode: a node with a `batch` block runs its inner chain once per item (seed 000).

prep resolves the items and keeps the shared reference; exec runs ONE attempt of one item on an
isolated shallow copy; `run_item` goes through `Node._exec` so PocketFlow's retries apply per item;
_exec hands the items to the run's backend (in-process loop or Celery chord); post aggregates.
"""

from __future__ import annotations

import copy
from typing import Any

from pocketflow import BatchNode, Node

from ir.errors import BatchItemFailed, BatchItemsError, RunCancelled
from ir.models import NodeSpec
from ir.templates import compile_value
from worker import context
from worker.aggregate import BatchResult, merge, merge_accumulators
from worker.executor import ItemMiddleware, StopSignals, run_in_process
from worker.outcome import ItemOutcome, failure_of
from worker.store import is_dunder
from worker.wrappers import clone_node


def accumulator_keys(shared: Any) -> tuple[str, ...]:
    """Root-level dunder lists that exist before the batch (e.g. `__llm_calls__`)."""
    return tuple(k for k, v in shared.items() if is_dunder(k) and isinstance(v, list))


class PflowBatchNode(BatchNode):
    def __init__(self, inner: Any, spec: NodeSpec):
        assert spec.batch is not None
        batch = spec.batch
        super().__init__(max_retries=batch.max_retries, wait=batch.retry_wait)
        self.inner = inner
        self.spec = spec
        self.node_id = spec.id
        self.batch = batch
        self.alias = batch.alias
        self._items = compile_value(batch.items)
        self._shared: dict[str, Any] = {}
        self._accumulators: tuple[str, ...] = ()
        self._appended: dict[str, list] = {}
        self._index = 0

    def clone(self) -> PflowBatchNode:
        twin = copy.copy(self)
        twin.inner = clone_node(self.inner)
        return twin

    def set_params(self, params: dict[str, Any]) -> None:
        """Flow-level params are ignored (see wrappers)."""

    # -- the PocketFlow lifecycle -------------------------------------------------------------
    def prep(self, shared: Any) -> list[Any]:
        items = self._items.resolve(shared, f"node '{self.node_id}' batch.items")
        if not isinstance(items, list):
            raise BatchItemsError(f"Batch items must be an array, got {type(items).__name__}")
        self.bind(shared)
        return items

    def bind(self, shared: Any) -> None:
        """Remember the store (or a worker's snapshot of it) the items are copied from."""
        self._shared = shared
        self._accumulators = accumulator_keys(shared)
        self._appended = {}

    def exec(self, item: Any) -> tuple[Any, dict[str, Any]]:
        """One attempt at one item, on `item_shared = dict(shared)` with the alias injected."""
        item_shared = dict(self._shared)
        item_shared[self.node_id] = {}
        item_shared[self.alias] = item
        item_shared["__index__"] = self._index
        if self._appended:
            item_shared.update(self._appended)
        return self.inner._run(item_shared), item_shared

    def run_item(self, index: int, item: Any) -> ItemOutcome:
        """The per-item executor: retries via Node._exec, then classify (DESIGN section 3)."""
        self._index = index
        # One fresh list per accumulator for the whole item, across its attempts: every call an item
        # made (e.g. an LLM call before a retry or a raise) is accounted for.
        if self._accumulators:
            self._appended = {key: [] for key in self._accumulators}
        try:
            action, item_shared = Node._exec(self, item)
        except Exception as exc:
            outcome = ItemOutcome.raised(index, item, exc)
            outcome.appended = self._collected()
            return outcome
        namespace = item_shared.get(self.node_id, {})
        appended = self._collected() if self._appended else None
        error = failure_of(action, namespace) if namespace or action == "error" else None
        if error is None:
            return ItemOutcome(index, namespace, None, None, None, appended)
        return ItemOutcome(index, namespace, error, None, item, appended)

    def _collected(self) -> dict[str, list] | None:
        return {k: v for k, v in self._appended.items() if v} or None

    def _exec(self, items: list[Any]) -> BatchResult:
        ctx = context.current()
        if ctx.backend is not None:
            return ctx.backend.run_batch(self, items)
        chunks = run_in_process(self, items, self.middleware(len(items)))
        if ctx.cancelled.is_set():
            raise RunCancelled(f"run cancelled during batch node '{self.node_id}'")
        return merge(chunks, len(items), self.batch.error_handling == "fail_fast")

    def middleware(self, total: int) -> list[ItemMiddleware]:
        """In-process hooks: cancel and fail-fast stops, plus whatever the run adds (progress events)."""
        ctx = context.current()
        hooks: list[ItemMiddleware] = [StopSignals(ctx.cancelled, self.batch.error_handling == "fail_fast")]
        if ctx.item_middleware is not None:
            hooks.extend(ctx.item_middleware(self.node_id, total))
        return hooks

    def post(self, shared: Any, prep_res: list[Any], exec_res: BatchResult) -> str:
        """The only write to the original store: the aggregate (never on a fail_fast failure)."""
        if exec_res.failure is not None:
            raise_item_failure(self.node_id, exec_res.failure)
        merge_accumulators(shared, exec_res.appended)
        shared[self.node_id] = exec_res.aggregate
        return "default"


def raise_item_failure(node_id: str, outcome: ItemOutcome) -> None:
    """fail_fast: re-raise the item's original exception, or say why a non-raising item failed."""
    if outcome.exception is not None:
        raise outcome.exception
    raise BatchItemFailed(f"batch node '{node_id}' item {outcome.index} failed: {outcome.error}")
