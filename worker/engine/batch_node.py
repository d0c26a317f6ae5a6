"""PflowBatchNode: a node with a `batch` block runs its inner chain once per item (the batch semantics: results
in input order, counts, errors).

prep resolves the items into a BatchJob (spec, items, the store they copy from); _exec hands the job to the run's
backend (in-process loop, or the cluster's chunk tasks and merge task), where the ItemExecutor applies the per-item
rules; post judges the merged outcomes (fail_fast, failure thresholds) and writes the aggregate — the only write to the
original store. No per-item state lives here.
"""

from __future__ import annotations

from typing import Any

from pocketflow import BatchNode

from ir.errors import BatchItemFailed, BatchItemsError, BatchThresholdExceeded
from ir.models import BatchSpec, NodeSpec
from ir.templates import compile_value
from worker.batch.aggregate import BatchResult, merge_accumulators
from worker.batch.backend import BatchJob
from worker.batch.cloning import clone_node
from worker.batch.middleware import tolerance_of
from worker.batch.outcome import ItemOutcome
from worker.engine import context


class PflowBatchNode(BatchNode):
    def __init__(self, inner: Any, spec: NodeSpec):
        assert spec.batch is not None
        super().__init__(max_retries=spec.batch.max_retries, wait=spec.batch.retry_wait)
        self.inner = inner
        self.spec = spec
        self.node_id = spec.id
        self.batch: BatchSpec = spec.batch
        self._items = compile_value(spec.batch.items)

    def clone(self) -> PflowBatchNode:
        return PflowBatchNode(clone_node(self.inner), self.spec)

    def set_params(self, params: dict[str, Any]) -> None:
        """Flow-level params are ignored (see wrappers)."""

    # -- the PocketFlow lifecycle -------------------------------------------------------------
    def prep(self, shared: Any) -> BatchJob:
        items = self._items.resolve(shared, f"node '{self.node_id}' batch.items")
        if not isinstance(items, list):
            raise BatchItemsError(f"Batch items must be an array, got {type(items).__name__}")
        ctx = context.current()
        return BatchJob(self.spec, items, shared, self.inner, ctx.batch_key(self.node_id))

    def _exec(self, job: BatchJob) -> BatchResult:
        backend = context.current().backend
        assert backend is not None
        node = self.inner
        while hasattr(node, "inner"):  # the wrappers
            node = node.inner
        before = getattr(node, "before_batch", None)
        if before is not None:  # the node's type prepares the batch (the `llm` node's provider batches)
            before(job)
        return backend.run_batch(job)

    def post(self, shared: Any, prep_res: BatchJob, exec_res: BatchResult) -> str:
        """The only write to the original store: the aggregate (never on a fail_fast failure, nor on
        more failures than tolerated)."""
        if exec_res.failure is not None:
            raise_item_failure(self.node_id, exec_res.failure)
        judge_failures(self.node_id, self.batch, exec_res, len(prep_res.items))
        merge_accumulators(shared, exec_res.appended)
        shared[self.node_id] = exec_res.aggregate
        return "default"


def raise_item_failure(node_id: str, outcome: ItemOutcome) -> None:
    """fail_fast: re-raise the item's original exception, or say why a non-raising item failed."""
    if outcome.exception is not None:
        raise outcome.exception
    raise BatchItemFailed(f"batch node '{node_id}' item {outcome.index} failed: {outcome.error}")


def judge_failures(node_id: str, batch: BatchSpec, result: BatchResult, count: int) -> None:
    """The failure threshold's verdict on the merged outcomes (the authoritative count, whatever stopped
    the batch early): more failed items than tolerated fail the node."""
    tolerance = tolerance_of(batch)
    verdict = tolerance.verdict(result.failed, count, noun="items") if tolerance.set else None
    if verdict is not None:
        raise BatchThresholdExceeded(f"batch node '{node_id}': {verdict}")
    if result.stopped is not None:  # only a threshold stops a continue batch that was not cancelled
        raise RuntimeError(f"batch node '{node_id}' incomplete: outcomes for {result.stopped[0]} of {count} items")
