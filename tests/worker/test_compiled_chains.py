"""The compiled per-execution path (worker/batch/cloning.py `runner`): a batch's items and a sub-workflow's
records run each node chain as one callable built once, and every behaviour of the general path stays on it:
a Throttled exec waited out, a node's own `exec_fallback`, error edges and the step limit inside a sub-run,
and stop hooks that only care about failed items."""

from __future__ import annotations

from typing import Any

import pytest
from pocketflow import Node

import scheduler
from ir.errors import StepLimitExceeded, Throttled
from worker.batch import checkpoints
from worker.batch.aggregate import ChunkResult
from worker.batch.cloning import runner
from worker.batch.executor import ItemExecutor, ItemMiddleware, run_items, run_slice
from worker.batch.middleware import item_middleware
from worker.batch.outcome import ItemOutcome
from worker.engine.build import item_chain
from worker.engine.loader import load
from worker.nodes import register

#: test-throttled-once: the items whose exec was called, in order (one entry per call).
EXECS: list[Any] = []


@register("test-throttled-once")
class ThrottledOnceNode(Node):
    """Its first exec per item raises Throttled (retry after 0 s); the next one returns the item doubled."""

    def prep(self, shared: Any) -> Any:
        return shared["item"]

    def exec(self, item: Any) -> Any:
        EXECS.append(item)
        if EXECS.count(item) == 1:
            raise Throttled("slow down", retry_after=0.0)
        return (item * 2, self.cur_retry)

    def post(self, shared: Any, prep_res: Any, exec_res: Any) -> str:
        shared["doubled"], shared["retry"] = exec_res
        return "default"


@register("test-falls-back")
class FallsBackNode(Node):
    """exec raises; its own exec_fallback gives the value the item keeps."""

    def exec(self, prep_res: Any) -> Any:
        raise RuntimeError("no")

    def exec_fallback(self, prep_res: Any, exc: Exception) -> Any:
        return f"fallback after {exc}"

    def post(self, shared: Any, prep_res: Any, exec_res: Any) -> str:
        shared["value"] = exec_res
        return "default"


def batch(node_type: str, items: list[Any]) -> dict[str, Any]:
    wf = {"nodes": [{"id": "b", "type": node_type, "batch": {"items": "${items}"}}]}
    result = scheduler.run(wf, {"items": items}, backend="local")
    assert result.status == "success", result.error
    return result.shared["b"]


def test_a_throttled_item_is_waited_out_on_the_compiled_path_without_using_an_attempt() -> None:
    EXECS.clear()
    aggregate = batch("test-throttled-once", [1, 2])
    assert aggregate["results"] == [{"doubled": 2, "retry": 0}, {"doubled": 4, "retry": 0}]
    assert EXECS == [1, 1, 2, 2]


def test_a_nodes_own_exec_fallback_gives_the_items_value_on_the_compiled_path() -> None:
    aggregate = batch("test-falls-back", [0])
    assert aggregate["results"] == [{"value": "fallback after no"}]


def test_a_compiled_chain_is_the_chain_run_as_one_call() -> None:
    spec = load({"nodes": [{"id": "e", "type": "echo", "params": {"said": "${said}"}}]}).nodes[0]
    chain = item_chain(spec)
    shared: dict[str, Any] = {"said": "hi", "e": {}}
    assert runner(chain)(shared) == "default"
    assert shared["e"] == {"said": "hi"}  # namespaced, its template resolved


def test_a_compiled_chain_reads_the_nodes_own_namespace_first_as_the_chain_does() -> None:
    """A node run again on one store (a loop) sees its own earlier writes before the root's keys: the compiled
    chain (its namespace view and templates fused) resolves `${said}` as the general path does, both runs."""
    spec = load({"nodes": [{"id": "e", "type": "echo", "params": {"said": "${said}!"}}]}).nodes[0]
    compiled: dict[str, Any] = {"said": "hi", "e": {}}
    general: dict[str, Any] = {"said": "hi", "e": {}}
    run, chain = runner(item_chain(spec)), item_chain(spec)
    for _ in range(2):
        run(compiled)
        chain._run(general)
        assert compiled == general
    assert compiled["e"] == {"said": "hi!!"}  # the second run read its own namespace's `said`, not the root's


def test_a_sub_workflow_on_the_quiet_path_routes_errors_and_stops_at_its_step_limit() -> None:
    routed = {
        "nodes": [
            {"id": "fail", "type": "test-falls-back-raising"},
            {"id": "handled", "type": "echo", "params": {"seen": "${_error.node_name}"}},
        ],
        "edges": [{"from": "fail", "to": "handled", "action": "error"}],
    }
    looping = {
        "max_steps": 5,
        "nodes": [{"id": "again", "type": "echo", "params": {"x": 1}}, {"id": "out", "type": "noop"}],
        "edges": [{"from": "again", "to": "again"}, {"from": "again", "to": "out", "action": "never"}],
    }
    ok = scheduler.run({"nodes": [{"id": "w", "type": "workflow", "params": {"workflow": routed}}]})
    assert ok.status == "success", ok.error
    assert ok.shared["w"]["handled"] == {"seen": "fail"}
    with pytest.raises(StepLimitExceeded, match=r"after 5 steps \(max_steps\): the node again -> again kept looping"):
        scheduler.run({"nodes": [{"id": "w", "type": "workflow", "params": {"workflow": looping}}]})


@register("test-falls-back-raising")
class RaisingNode(Node):
    """exec raises; no fallback of its own."""

    def exec(self, prep_res: Any) -> Any:
        raise RuntimeError("broken")


class Seen(ItemMiddleware):
    def __init__(self, every_item: bool):
        self.every_item = every_item
        self.indexes: list[int] = []

    def after_item(self, outcome: ItemOutcome) -> None:
        self.indexes.append(outcome.index)


def test_a_hook_for_failed_items_only_is_called_for_those_alone() -> None:
    spec = load(
        {"nodes": [{"id": "b", "type": "echo", "params": {"v": "${item}"}, "batch": {"items": "${items}"}}]}
    ).nodes[0]
    every, failed = Seen(True), Seen(False)
    chunk = run_items(ItemExecutor(spec, item_chain(spec), {}), ["ok", "Error: bad", "ok"], 10, [every, failed])
    assert every.indexes == [10, 11, 12]
    assert failed.indexes == [11]
    assert [f.index for f in chunk.failures] == [11]


class StopAt(ItemMiddleware):
    def __init__(self, index: int):
        self.index = index

    def before_item(self, index: int) -> bool:
        return index < self.index


@pytest.mark.parametrize("keep_seconds", [0.0, 0.5])
def test_checkpoints_following_a_sequential_loop_keep_every_outcome_once_in_order(
    monkeypatch: pytest.MonkeyPatch, keep_seconds: float
) -> None:
    """Checkpoints read a sequential slice's outcomes where its loop collects them (no call per item); a writer
    writing all the time (0 s) or only at the end still keeps each outcome once, failures with their items."""
    monkeypatch.setattr(checkpoints, "KEEP_SECONDS", keep_seconds)
    spec = load(
        {"nodes": [{"id": "b", "type": "echo", "params": {"v": "${item}"}, "batch": {"items": "${items}"}}]}
    ).nodes[0]
    items = ["Error: bad" if i % 7 == 3 else "ok" for i in range(3000)]
    kept: list[ChunkResult] = []
    keeper = checkpoints.Checkpoints(100, len(items), kept.extend)
    chunk = run_items(ItemExecutor(spec, item_chain(spec), {}), items, 100, [StopAt(2900), keeper])
    assert len(chunk.results) == 2800
    position, results, failures = 100, [], []
    for part in kept:
        assert part.start == position
        position += len(part.results)
        results.extend(part.results)
        failures.extend(f.index for f in part.failures)
    assert results == chunk.results  # cut short: every outcome written, once, in order
    assert failures == [f.index for f in chunk.failures] == [i + 100 for i in range(2800) if i % 7 == 3]


@pytest.mark.parametrize("threads", [1, 3])
def test_chunk_progress_counts_a_followed_loop_as_it_counts_one_item_at_a_time(threads: int) -> None:
    """A dataset chunk's progress: an event per failed record (with the count done so far) and one for the rest
    (the last that succeeded), whether it follows a sequential loop's chunk or is told of every item (threads)."""
    spec = load(
        {
            "nodes": [
                {
                    "id": "b",
                    "type": "echo",
                    "params": {"v": "${item}"},
                    "batch": {"items": "${items}", "parallel": threads > 1, "max_concurrent": threads},
                }
            ]
        }
    ).nodes[0]
    items = ["ok", "Error: a", "ok", "ok", "Error: b", "Error: c"]
    events: list[dict[str, Any]] = []
    hooks = item_middleware("records", 20, False, emit=events.append, done_before=7, per_chunk=True)
    run_slice(ItemExecutor(spec, item_chain(spec), {}), items, 40, hooks)
    failed = sorted((e["index"], e["done"]) for e in events if not e["ok"])
    assert [index for index, _ in failed] == [41, 44, 45]
    if threads == 1:
        assert failed == [(41, 9), (44, 12), (45, 13)]
    assert [(e["index"], e["done"]) for e in events if e["ok"]] == [(43, 13)]
