"""batch.parallel / max_concurrent: same aggregate as sequential, original exceptions, bounded concurrency."""

from __future__ import annotations

import pytest

import scheduler
from tests.support import batch_node, run_in_process, unique, workflow
from tests.support import nodes as tn


def _mixed_workflow(parallel: bool, max_concurrent: int | None = 3) -> dict:
    """Several batches covering successes, raised errors, "Error:" strings, accumulators and the alias/index."""
    opts = {"parallel": parallel}
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
