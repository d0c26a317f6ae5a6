"""batch.parallel / max_concurrent: same aggregate as sequential, original exceptions, bounded concurrency, in
this process and on workers (a chunk's items on threads of its worker, max_concurrent across the cluster)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import scheduler
from ir.models import NodeSpec
from scheduler import api
from tests.support import batch_node, run_in_process, unique, workflow
from tests.support import nodes as tn
from worker.batch.executor import DEFAULT_THREADS, ItemExecutor, ItemMiddleware, run_parallel
from worker.cluster.batches.middleware import ConcurrencyPermit
from worker.cluster.state.runstate import RunState, client
from worker.engine import context, rate_limits
from worker.engine.build import item_chain


def _mixed_workflow(parallel: bool, max_concurrent: int | None = 3, **batch: Any) -> dict:
    """Several batches covering successes, raised errors, "Error:" strings, accumulators and the alias/index."""
    opts: dict[str, Any] = {"parallel": parallel, **batch}
    if max_concurrent is not None:
        opts["max_concurrent"] = max_concurrent
    return workflow(
        batch_node("up", params={"text": "${item}"}, **opts),
        batch_node(
            "raised",
            node_type="test-fail",
            params={"value": "${item}", "fail": "${item.bad}"},
            items="${rows}",
            error_handling="continue",
            **opts,
        ),
        batch_node(
            "strings",
            node_type="test-error-string",
            params={"value": "${item}", "error_on": "c"},
            error_handling="continue",
            **opts,
        ),
        batch_node("calls", node_type="test-llm-calls", params={"item": "${item}"}, **opts),
        batch_node(
            "seen",
            node_type="echo",
            params={"v": "${row}", "i": "${__index__}"},
            items="${rows}",
            **{"as": "row"},
            **opts,
        ),
    )


def _mixed_shared() -> dict:
    return {
        "x": list("abcdefghij"),
        "rows": [{"bad": i % 3 == 1, "n": i} for i in range(10)],
        "__llm_calls__": [],
    }


@pytest.mark.parametrize("max_concurrent", [2, 3, 16, None])
def test_parallel_same_aggregate_as_sequential(backend, max_concurrent):
    sequential = scheduler.run(_mixed_workflow(False), shared=_mixed_shared(), backend=backend)
    parallel = scheduler.run(_mixed_workflow(True, max_concurrent), shared=_mixed_shared(), backend=backend)
    assert sequential.status == parallel.status == "success"
    assert parallel.shared == sequential.shared
    # And the shared result is what it should be, not merely equal.
    shared = parallel.shared
    assert shared["up"]["results"] == [{"value": c.upper()} for c in "abcdefghij"]
    assert [e["index"] for e in shared["raised"]["errors"]] == [1, 4, 7]
    assert shared["raised"]["results"][1] is None
    assert shared["strings"]["errors"] == [{"index": 2, "item": "c", "error": "Error: c is bad"}]
    assert shared["__llm_calls__"] == [{"index": i, "item": c} for i, c in enumerate("abcdefghij")]
    assert shared["seen"]["results"] == [{"v": row, "i": i} for i, row in enumerate(_mixed_shared()["rows"])]


def test_parallel_fail_fast_raises_original_exception(backend):
    wf = workflow(
        batch_node(node_type="test-fail", params={"value": "${item}", "fail_on": "e"}, parallel=True, max_concurrent=3)
    )
    shared = {"x": list("abcdefgh")}
    with pytest.raises(ValueError, match=r"^boom e$") as info:
        scheduler.run(wf, shared=shared, backend=backend)
    assert type(info.value) is ValueError
    assert "b" not in shared


def _failed_indices(events: list[dict]) -> list[int]:
    return sorted(e["index"] for e in events if e["type"] == "batch_progress" and not e["ok"])


def test_parallel_fail_fast_reports_lowest_failed_index(backend):
    # When several items fail, the lowest index among those that ran is reported (README, batch semantics).
    # Which items run before the first failure stops the batch is timing, so here the items meet at a barrier
    # before raising: several of them fail, whichever is scheduled first. In-process: the 4 threads; celery:
    # the suite cluster's two solo workers, one single-item chunk each (the first two items; the rest is stopped).
    if backend == "local":
        tn.PROBE.reset(parties=4)
        params = {"item": "${item}", "fail": True}
        node = batch_node(node_type="test-concurrency", params=params, parallel=True, max_concurrent=4)
    else:
        params = {"value": "${item}", "gate": unique("gate-"), "parties": 2}
        node = batch_node(node_type="test-fail-together", params=params, parallel=True, max_concurrent=4, chunk_size=1)
    events: list[dict] = []
    with pytest.raises(ValueError, match=r"^boom a$"):
        scheduler.run(workflow(node), shared={"x": list("abcd")}, backend=backend, on_event=events.append)
    assert {0, 1} <= set(_failed_indices(events))


def test_parallel_fail_fast_reports_lowest_failure_among_items_that_ran(backend):
    # Unsynchronized: any item may fail first and stop the others; the reported one is still the lowest that ran.
    wf = workflow(
        batch_node(node_type="test-fail", params={"value": "${item}", "fail": True}, parallel=True, max_concurrent=4)
    )
    events: list[dict] = []
    with pytest.raises(ValueError) as info:
        scheduler.run(wf, shared={"x": list("abcd")}, backend=backend, on_event=events.append)
    failed = _failed_indices(events)
    assert failed
    assert str(info.value) == f"boom {'abcd'[failed[0]]}"


def test_parallel_retries_per_item(backend):
    """pocketflow keeps cur_retry on the node instance: parallel items must not share it."""
    items = [unique("pr-") for _ in range(12)]
    wf = workflow(
        batch_node(
            node_type="test-flaky",
            params={"item": "${item}", "fails": 2},
            parallel=True,
            max_concurrent=4,
            max_retries=3,
            error_handling="continue",
        )
    )
    agg = scheduler.run(wf, shared={"x": items}, backend=backend).shared["b"]
    assert agg["errors"] is None
    assert agg["results"] == [{"value": i, "attempts": 3} for i in items]


@pytest.mark.parametrize(("items", "max_concurrent"), [(12, 3), (8, 2), (16, 4)])
def test_concurrency_reaches_and_never_exceeds_max_concurrent(items, max_concurrent):
    # Every item waits at a barrier of max_concurrent parties: it only opens when that many items are inside
    # exec together, which proves they overlap (a sequential run would break the barrier and fail the items).
    # Items run in rounds, so each round gives extra (unbounded) threads a chance to show up in peak/threads.
    tn.PROBE.reset(parties=max_concurrent)
    wf = workflow(
        batch_node(
            node_type="test-concurrency", params={"item": "${item}"}, parallel=True, max_concurrent=max_concurrent
        )
    )
    shared = run_in_process(wf, {"x": list(range(items))})
    assert shared["b"]["results"] == [{"value": i} for i in range(items)]
    assert shared["b"]["errors"] is None
    assert tn.PROBE.peak == max_concurrent
    assert len(tn.PROBE.threads) == max_concurrent


def test_max_concurrent_one_is_sequential():
    tn.PROBE.reset()
    wf = workflow(batch_node(node_type="test-concurrency", params={"item": "${item}"}, parallel=True, max_concurrent=1))
    shared = run_in_process(wf, {"x": list(range(5))})
    assert shared["b"]["count"] == 5
    assert tn.PROBE.peak == 1
    assert len(tn.PROBE.threads) == 1


def test_sequential_batch_never_overlaps():
    tn.PROBE.reset()
    wf = workflow(batch_node(node_type="test-concurrency", params={"item": "${item}"}))
    run_in_process(wf, {"x": list(range(5))})
    assert tn.PROBE.peak == 1


def test_reversed_completion_keeps_index_order():
    """Items finish last-to-first; results, errors and accumulator entries still come out in index order."""
    total = 5
    wf = workflow(
        batch_node(
            node_type="test-reverse",
            params={"item": "${item}", "total": total, "error_at": [1, 3]},
            parallel=True,
            max_concurrent=total,
            error_handling="continue",
        )
    )
    calls: list = []
    items = [f"i{k}" for k in range(total)]
    shared = run_in_process(wf, {"x": items, "__llm_calls__": calls})
    assert tn.REVERSE.finished == [4, 3, 2, 1, 0], "the gate must have forced reversed completion"
    agg = shared["b"]
    assert agg["results"] == [
        {"value": "i0"},
        {"value": "Error: i1"},
        {"value": "i2"},
        {"value": "Error: i3"},
        {"value": "i4"},
    ]
    assert agg["errors"] == [
        {"index": 1, "item": "i1", "error": "Error: i1"},
        {"index": 3, "item": "i3", "error": "Error: i3"},
    ]
    assert calls == [{"index": k, "item": f"i{k}"} for k in range(total)]
    assert shared["__llm_calls__"] is calls


def test_parallel_items_isolated():
    wf = workflow(batch_node(node_type="test-record", params={"item": "${item}"}, parallel=True, max_concurrent=4))
    shared = run_in_process(wf, {"x": list(range(12)), "item": "original"})
    assert sorted(tn.recorded()) == [(i, i) for i in range(12)]
    assert all(c.store["item"] == c.index for c in tn.RECORDS)
    assert len({id(c.store) for c in tn.RECORDS}) == 12
    assert shared["item"] == "original"
    assert shared["b"]["results"] == [{"value": i} for i in range(12)]


def test_item_threads_see_the_callers_rate_limiter():
    """ThreadPoolExecutor does not carry contextvars: the run context (its limiter, sink, cancel flag) must be
    copied into each item thread, or `rate_limits.current()` there would fall back to the process's."""
    limiter = rate_limits.LocalLimiter()
    wf = workflow(batch_node(node_type="test-limiter", params={}, parallel=True, max_concurrent=4))
    with context.using(context.RunContext(limiter=limiter)):
        shared = run_in_process(wf, {"x": list(range(8))})
    results = shared["b"]["results"]
    assert {r["limiter_id"] for r in results} == {id(limiter)}
    assert threading.get_ident() not in {r["thread"] for r in results}  # they did run on other threads


# -- a chunk's items on threads of its worker -------------------------------------------------------------


def _gauged(parties: int, **batch: Any) -> tuple[dict, str]:
    """A parallel batch of test-gauge-gate items (value: the item) that meet `parties` at a time in Redis;
    returns it and the gauge's key (`<key>:max`: the most items in flight at once, cluster-wide)."""
    key = unique("gauge-")
    params = {"value": "${item}", "key": key, "gate": unique("gate-"), "parties": parties}
    return workflow(batch_node(node_type="test-gauge-gate", params=params, parallel=True, **batch)), key


@pytest.mark.parametrize("max_concurrent", [4, None])
def test_a_worker_runs_several_items_of_one_chunk_at_once(celery_cluster, max_concurrent):
    # One chunk (chunk_size = every item), so one worker process. Its items meet at a barrier of as many parties
    # as the chunk has threads (max_concurrent, else DEFAULT_THREADS): it opens only when that many items are
    # inside exec together, so items run one at a time would fail (TimeoutError) instead of passing.
    threads = max_concurrent or DEFAULT_THREADS
    items = 2 * threads
    limit = {"max_concurrent": max_concurrent} if max_concurrent else {}
    wf, key = _gauged(threads, chunk_size=items, **limit)
    events: list[dict] = []
    result = scheduler.run(wf, {"x": list(range(items))}, backend="celery", on_event=events.append)
    aggregate = result.shared["b"]
    assert aggregate["errors"] is None
    assert [r["value"] for r in aggregate["results"]] == list(range(items))
    assert int(client().get(f"{key}:max")) == threads
    workers = {r["worker"].split("@")[0] for r in aggregate["results"]}  # item threads run as the chunk's task
    assert len(workers) == 1 and workers <= {"w1", "w2"}
    progress = [e for e in events if e["type"] == "batch_progress"]
    assert sorted(e["index"] for e in progress) == list(range(items))
    assert [e["done"] for e in progress] == list(range(1, items + 1))


def test_max_concurrent_caps_the_threads_of_two_chunks_on_two_workers_together(celery_cluster):
    # Two chunks of 6 items, one on each solo worker (a worker holds one unacknowledged chunk at a time), each on
    # 3 threads: 6 items could be in flight, the batch's 3 permits let 3. Items meet 3 at a time, so 3 is reached;
    # the gauge, counted in Redis around every item, shows it is never passed.
    wf, key = _gauged(3, max_concurrent=3, chunk_size=6)
    result = scheduler.run(wf, {"x": list(range(12))}, backend="celery")
    aggregate = result.shared["b"]
    assert aggregate["errors"] is None
    assert [r["value"] for r in aggregate["results"]] == list(range(12))
    assert int(client().get(f"{key}:max")) == 3
    assert {r["worker"].split("@")[0] for r in aggregate["results"]} == {"w1", "w2"}


def test_a_sequential_chunk_still_runs_one_item_at_a_time_on_its_worker(celery_cluster):
    key = unique("gauge-")
    wf = workflow(batch_node(node_type="test-gauge", params={"key": key, "seconds": 0.02}, chunk_size=8))
    result = scheduler.run(wf, {"x": list(range(8))}, backend="celery")
    assert result.shared["b"]["success_count"] == 8
    assert int(client().get(f"{key}:max")) == 1


@pytest.mark.parametrize("max_concurrent", [3, None])
def test_one_parallel_chunk_same_aggregate_as_sequential(backend, max_concurrent):
    # chunk_size 10 = every item: on the cluster each batch is one chunk whose items run on its worker's threads.
    sequential = scheduler.run(_mixed_workflow(False, chunk_size=10), shared=_mixed_shared(), backend=backend)
    parallel = scheduler.run(
        _mixed_workflow(True, max_concurrent, chunk_size=10), shared=_mixed_shared(), backend=backend
    )
    assert sequential.status == parallel.status == "success"
    assert parallel.shared == sequential.shared
    assert parallel.shared["__llm_calls__"] == [{"index": i, "item": c} for i, c in enumerate("abcdefghij")]
    assert [e["index"] for e in parallel.shared["raised"]["errors"]] == [1, 4, 7]


def test_fail_fast_in_one_parallel_chunk_starts_no_item_after_a_failure(celery_cluster):
    # The one chunk's 4 threads take items 0-3 (in index order) and meet at the gate; all four fail, and each
    # thread's own failure stops the chunk before that thread takes another item: exactly items 0-3 ran.
    params = {"value": "${item}", "gate": unique("gate-"), "parties": 4}
    node = batch_node(node_type="test-fail-together", params=params, parallel=True, max_concurrent=4, chunk_size=8)
    events: list[dict] = []
    shared = {"x": list("abcdefgh")}
    with pytest.raises(ValueError, match=r"^boom a$"):
        scheduler.run(workflow(node), shared=shared, backend="celery", on_event=events.append)
    assert sorted(e["index"] for e in events if e["type"] == "batch_progress") == [0, 1, 2, 3]
    assert _failed_indices(events) == [0, 1, 2, 3]
    assert "b" not in shared


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_cancelled_parallel_chunk_keeps_a_prefix_and_resume_runs_the_rest_once(celery_cluster, tmp_path):
    # A cluster run whose batch is one parallel chunk. Threads take items in index order and stop taking them at
    # the cancel, so the items that ran are 0..k-1 (what a sequential chunk leaves); the resume runs k.. once.
    total, log = 400, tmp_path / "log"
    params = {"log": str(log), "label": "${item}", "seconds": 0.05}
    node = batch_node(node_type="test-side-effect", params=params, parallel=True, max_concurrent=4, chunk_size=total)
    run_id = scheduler.submit(workflow(node), {"x": list(range(total))})
    state = RunState(run_id)
    assert state.redis.xread({state.keys.events: "0-0"}, block=60_000, count=1), "no item ever ran"
    api.cancel(run_id)
    assert scheduler.wait(run_id, timeout=60).status == "cancelled"
    ran = sorted(map(int, _lines(log)))
    assert 0 < len(ran) < total
    assert ran == list(range(len(ran)))
    api.resume_cluster(run_id)
    result = scheduler.wait(run_id, timeout=90)
    assert result.status == "success"
    assert [r["label"] for r in result.shared["b"]["results"]] == [str(i) for i in range(total)]
    assert sorted(map(int, _lines(log))) == list(range(total))  # every item exactly once overall


def test_item_threads_on_a_worker_see_the_limiter_its_chunk_sees(celery_cluster):
    # Both batches are one chunk: the sequential one runs its items on the chunk's own thread, the parallel one on
    # threads started for it, which must see the same rate limiter (the cluster's, installed in the worker).
    wf = workflow(
        batch_node("seq", node_type="test-limiter", params={}, chunk_size=6),
        batch_node("par", node_type="test-limiter", params={}, parallel=True, max_concurrent=3, chunk_size=6),
    )
    shared = scheduler.run(wf, {"x": list(range(6))}, backend="celery").shared
    seen = {r["limiter"] for r in shared["seq"]["results"]}
    assert len(seen) == 1
    assert {r["limiter"] for r in shared["par"]["results"]} == seen


class _Entered(ItemMiddleware):
    """Records each thread a parallel loop starts (a test probe beside the real middleware)."""

    def __init__(self) -> None:
        self.threads: set[int] = set()
        self.lock = threading.Lock()

    def enter_thread(self) -> None:
        with self.lock:
            self.threads.add(threading.get_ident())


def test_chunks_waiting_for_permits_start_no_more_threads_than_permits_plus_one_asking_each(celery_cluster):
    # Three chunks of one batch run at once in this process (as on a -P threads worker), each allowed 8 threads,
    # under 2 cluster-wide permits (the real ConcurrencyPermit, in the suite's Redis). Items hold until released.
    # A chunk starts its next thread only once one was admitted, so while the 2 permits are held at most
    # 2 + 3 threads exist (those holding a permit and one asking per chunk), not 3 x 8.
    spec = NodeSpec.model_validate(
        {"id": "b", "type": "test-wait-event", "params": {}, "batch": {"items": "${x}", "parallel": True,
                                                                        "max_concurrent": 8}}
    )  # fmt: skip
    tn.EVENT.clear()
    state, batch, entered = RunState(unique("threads-")), "b#0", _Entered()
    chunks, outcomes = [(0, list(range(8))), (8, list(range(8))), (16, list(range(8)))], {}

    def chunk(start: int, items: list[int]) -> None:
        executor = ItemExecutor(spec, item_chain(spec), {"x": []})
        permit = ConcurrencyPermit(state, batch, 2, start, poll=0.02)
        outcomes[start] = run_parallel(executor, items, start, [permit, entered], threads=8)

    runners = [threading.Thread(target=chunk, args=c) for c in chunks]
    for runner in runners:
        runner.start()
    deadline = time.monotonic() + 30
    while tn.EVENT.waiting < 2:  # both permits taken, their items inside exec
        assert time.monotonic() < deadline, "two items never started"
        time.sleep(0.01)
    time.sleep(0.3)  # let any extra thread a chunk would start show up in `entered`
    assert len(entered.threads) <= 2 + 3, len(entered.threads)
    tn.EVENT.set()
    for runner in runners:
        runner.join(60)
    assert [len(outcomes[start].results) for start, _ in chunks] == [8, 8, 8]
