"""Per-item batch retries: batch.max_retries is the total number of attempts per item; retry_wait is the wait."""

from __future__ import annotations

import pytest

import scheduler
from tests.support import batch_node, chain, unique, workflow


def _flaky_batch(fails: int, **batch) -> dict:
    return workflow(batch_node(node_type="test-flaky", params={"item": "${item}", "fails": fails}, **batch))


def test_succeeds_on_third_attempt_with_max_retries_3(backend):
    items = [unique("r3-") for _ in range(3)]
    result = scheduler.run(_flaky_batch(2, max_retries=3), shared={"x": items}, backend=backend)
    agg = result.shared["b"]
    assert agg["results"] == [{"value": i, "attempts": 3} for i in items]
    assert (agg["success_count"], agg["error_count"], agg["errors"]) == (3, 0, None)


def test_fails_with_max_retries_2_fail_fast(backend):
    items = [unique("r2-"), unique("r2-")]
    shared = {"x": items}
    # Both items fail. Which failure is reported is the lowest index among the items that ran: on the
    # celery backend the two items are in separate chunks and either may fail (and abort the other) first.
    with pytest.raises(ConnectionError, match=rf"^flaky ({items[0]}|{items[1]}) attempt 2$"):
        scheduler.run(_flaky_batch(2, max_retries=2), shared=shared, backend=backend)
    assert "b" not in shared


def test_fails_with_max_retries_2_continue(backend):
    items = [unique("c2-"), unique("c2-")]
    agg = scheduler.run(
        _flaky_batch(2, max_retries=2, error_handling="continue"), shared={"x": items}, backend=backend
    ).shared["b"]
    assert agg["results"] == [None, None]
    assert agg["errors"] == [
        {"index": i, "item": item, "error": f"flaky {item} attempt 2", "exception_type": "ConnectionError"}
        for i, item in enumerate(items)
    ]


def test_default_is_one_attempt(backend):
    item = unique("d-")
    agg = scheduler.run(_flaky_batch(1, error_handling="continue"), shared={"x": [item]}, backend=backend).shared["b"]
    assert agg["errors"][0]["error"] == f"flaky {item} attempt 1"


def test_retries_are_per_item(backend):
    """Each item gets its own max_retries attempts: a later item is not charged for an earlier one's retries."""
    items = [unique("p-") for _ in range(4)]
    agg = scheduler.run(
        _flaky_batch(2, max_retries=3, error_handling="continue"), shared={"x": items}, backend=backend
    ).shared["b"]
    assert [r["attempts"] for r in agg["results"]] == [3, 3, 3, 3]


def test_retry_wait_set_on_batch_node():
    flow = scheduler.compile(_flaky_batch(2, max_retries=4, retry_wait=0.5))
    batch = chain(flow.start_node)[1]
    assert type(batch).__name__ == "PflowBatchNode"
    assert batch.max_retries == 4
    assert batch.wait == 0.5


def test_retry_wait_default_zero():
    batch = chain(scheduler.compile(_flaky_batch(2)).start_node)[1]
    assert (batch.max_retries, batch.wait) == (1, 0)


def test_retry_wait_run_still_succeeds(backend):
    items = [unique("w-")]
    agg = scheduler.run(_flaky_batch(1, max_retries=2, retry_wait=0.01), shared={"x": items}, backend=backend).shared[
        "b"
    ]
    assert agg["results"] == [{"value": items[0], "attempts": 2}]


def test_batch_retries_independent_of_node_retries(backend):
    """Node-level max_retries retries inside each batch attempt: 2 node attempts x 2 batch attempts = 4."""
    items = [unique("n-")]
    wf = workflow(
        {
            **batch_node(node_type="test-flaky", params={"item": "${item}", "fails": 3}, max_retries=2),
            "max_retries": 2,
        }
    )
    agg = scheduler.run(wf, shared={"x": items}, backend=backend).shared["b"]
    assert agg["results"] == [{"value": items[0], "attempts": 4}]
