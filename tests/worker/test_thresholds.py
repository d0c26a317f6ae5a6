"""Failure thresholds on IR batch blocks (`tolerated_failure_percent` / `tolerated_failure_count`, with
`error_handling: "continue"`), on the local backend and on a real cluster (redis-server + Celery workers).

Within the threshold a batch succeeds as `continue` does; past it the batch stops starting items and the
node fails with `batch node '<id>': failed F of N items (P%), tolerated T`. Attempts are counted in files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import ir
import scheduler
from ir.errors import BatchThresholdExceeded
from scheduler.localcluster import Cluster
from tests.scheduler.cli.test_cli import run_cli, write_wf
from tests.support import batch_node, unique, workflow

FAILING = {"value": "${item.v}", "fail": "${item.fail}"}  # test-fail raises for an item with `fail` true


def failing_items(total: int, failed: set[int]) -> list[dict[str, Any]]:
    return [{"v": i, "fail": i in failed} for i in range(total)]


def fail_wf(**batch: Any) -> dict[str, Any]:
    return workflow(batch_node("b", "test-fail", params=FAILING, error_handling="continue", **batch))


def run_failing(backend: str, total: int, failed: set[int], **batch: Any) -> tuple[str, dict[str, Any]]:
    """Runs the batch; returns (the BatchThresholdExceeded message, the store), failing if it was not raised."""
    run_id, shared = unique("thr"), {}
    with pytest.raises(BatchThresholdExceeded) as raised:
        scheduler.run(
            fail_wf(**batch), {"x": failing_items(total, failed)}, shared=shared, backend=backend, run_id=run_id
        )
    record = scheduler.status(run_id)
    assert record["status"] == "failed"
    assert record["error"] == f"BatchThresholdExceeded: {raised.value}"
    return str(raised.value), shared


def logging_wf(log: Path, **batch: Any) -> dict[str, Any]:
    """A batch of test-side-effect items: item `i` appends `i` to `log`, or fails (writing nothing) when
    its `requires` file is missing. Lines in `log` = successful items attempted."""
    params = {"log": str(log), "label": "${item.v}", "requires": "${item.requires}"}
    return workflow(batch_node("b", "test-side-effect", params=params, error_handling="continue", **batch))


def logging_items(total: int, present: Path, missing: Path, every: int) -> list[dict[str, Any]]:
    """Items whose index is a multiple of `every` fail; the others succeed."""
    return [{"v": i, "requires": str(missing if i % every == 0 else present)} for i in range(total)]


# -- within and past the threshold ------------------------------------------------------------------------


@pytest.mark.parametrize("threshold", [{"tolerated_failure_percent": 10}, {"tolerated_failure_count": 2}])
def test_failures_up_to_the_threshold_succeed_with_errors_listed(backend: str, threshold: dict[str, Any]) -> None:
    total, failed = 20, {3, 17}  # exactly at the bound: 10 %, 2 items
    result = scheduler.run(fail_wf(**threshold), {"x": failing_items(total, failed)}, backend=backend)
    assert result.status == "success"
    aggregate = result.shared["b"]
    assert (aggregate["count"], aggregate["success_count"], aggregate["error_count"]) == (20, 18, 2)
    assert [(e["index"], e["error"]) for e in aggregate["errors"]] == [(3, "boom 3"), (17, "boom 17")]
    assert [e.get("exception_type") for e in aggregate["errors"]] == ["ValueError", "ValueError"]  # both backends
    assert [r and r["value"] for r in aggregate["results"]] == [None if i in failed else i for i in range(total)]


def test_failures_past_the_percentage_fail_the_node_with_the_message(backend: str) -> None:
    message, shared = run_failing(backend, 10, {2, 5, 8}, tolerated_failure_percent=20)
    assert message == "batch node 'b': failed 3 of 10 items (30.0%), tolerated 20%"
    assert "b" not in shared  # no aggregate is written for a failed batch


def test_failures_past_the_count_fail_the_node_with_the_message(backend: str) -> None:
    message, _ = run_failing(backend, 10, {1, 6}, tolerated_failure_count=1, chunk_size=5)
    assert message == "batch node 'b': failed 2 of 10 items (20.0%), tolerated 1"


def test_a_percentage_passed_only_by_the_last_item_still_fails(backend: str) -> None:
    # Nothing is left to stop when the last item fails: the verdict is taken on the merged outcomes.
    message, _ = run_failing(backend, 10, {9}, tolerated_failure_percent=5, chunk_size=10)
    assert message == "batch node 'b': failed 1 of 10 items (10.0%), tolerated 5%"


def test_a_share_just_over_the_percentage_is_shown_with_the_digits_that_say_so(backend: str) -> None:
    """3 of 149 is 2.013%: `2.0%, tolerated 2%` would read as within the bound."""
    message, _ = run_failing(backend, 149, {1, 50, 100}, tolerated_failure_percent=2)
    assert message == "batch node 'b': failed 3 of 149 items (2.01%), tolerated 2%"


@pytest.mark.parametrize("parallel", [False, True])
def test_past_the_count_the_batch_stops_starting_items(backend: str, tmp_path: Path, parallel: bool) -> None:
    # One failure in every block of 10 (the first item of each chunk): no chunk passes `count=1` on its
    # own, so on the cluster only the batch's failure count in Redis can stop the others.
    log, present, missing = tmp_path / "log", tmp_path / "present", tmp_path / "missing"
    present.touch()
    total = 1000
    wf = logging_wf(log, tolerated_failure_count=1, chunk_size=10, parallel=parallel, max_concurrent=2)
    with pytest.raises(BatchThresholdExceeded) as raised:
        scheduler.run(wf, {"x": logging_items(total, present, missing, every=10)}, backend=backend)
    match = re.fullmatch(r"batch node 'b': failed (\d+) of 1000 items \(\S+%\), tolerated 1", str(raised.value))
    assert match, raised.value
    successes = len(log.read_text().splitlines()) if log.exists() else 0
    # Without the stop every item runs: 900 successes. Two failures end it after a few blocks.
    assert 2 <= int(match[1]) <= 10
    assert successes < 100


# -- the cluster runs the batch on its own --------------------------------------------------------------


def test_submitted_run_past_the_count_ends_failed_with_the_message(celery_cluster: Cluster, tmp_path: Path) -> None:
    log, present, missing = tmp_path / "log", tmp_path / "present", tmp_path / "missing"
    present.touch()
    total = 1000
    wf = logging_wf(log, tolerated_failure_count=1, chunk_size=10)
    run_id = scheduler.submit(wf, {"x": logging_items(total, present, missing, every=10)})
    with pytest.raises(BatchThresholdExceeded, match=r"batch node 'b': failed \d+ of 1000 items"):
        scheduler.wait(run_id, timeout=60)  # the node's exception, raised again here
    record = scheduler.status(run_id)
    assert (record["status"], record["node"]) == ("failed", "b")
    pattern = r"BatchThresholdExceeded: batch node 'b': failed \d+ of 1000 items \(\S+%\), tolerated 1"
    assert re.fullmatch(pattern, record["error"]), record["error"]
    assert len(log.read_text().splitlines()) < 100  # of 900 successful items: the batch stopped early


# -- validation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "problem"),
    [
        ({"tolerated_failure_percent": 5}, "batch.tolerated_failure_percent requires error_handling 'continue'"),
        (
            {"tolerated_failure_count": 0, "error_handling": "fail_fast"},
            "batch.tolerated_failure_count requires error_handling 'continue'",
        ),
        (
            {"tolerated_failure_percent": 100.5, "error_handling": "continue"},
            "batch.tolerated_failure_percent must be a number from 0 to 100, got 100.5",
        ),
        (
            {"tolerated_failure_percent": "5%", "error_handling": "continue"},
            "batch.tolerated_failure_percent must be a number from 0 to 100, got '5%'",
        ),
        (
            {"tolerated_failure_count": -1, "error_handling": "continue"},
            "batch.tolerated_failure_count must be an integer >= 0, got -1",
        ),
        (
            {"tolerated_failure_count": 1.5, "error_handling": "continue"},
            "batch.tolerated_failure_count must be an integer >= 0, got 1.5",
        ),
    ],
)
def test_invalid_thresholds_are_validation_errors(batch: dict[str, Any], problem: str) -> None:
    with pytest.raises(ir.ValidationError) as raised:
        ir.load(workflow(batch_node("b", **batch)))
    assert problem in str(raised.value)
    assert str(raised.value).startswith("nodes[0] (id 'b').batch")


def test_valid_thresholds_load() -> None:
    wf = ir.load(
        workflow(batch_node("b", error_handling="continue", tolerated_failure_percent=0, tolerated_failure_count=3))
    )
    batch = wf.nodes[0].batch
    assert batch is not None
    assert (batch.tolerated_failure_percent, batch.tolerated_failure_count) == (0, 3)


@pytest.mark.processes
def test_chordflow_validate_reports_every_threshold_problem(tmp_path: Path) -> None:
    wf = workflow(
        batch_node("a", tolerated_failure_count=2),
        batch_node("b", error_handling="continue", tolerated_failure_percent=-1, tolerated_failure_count=-2),
    )
    proc = run_cli("validate", write_wf(tmp_path, wf))
    assert proc.returncode == 2, proc.stdout
    assert "Traceback" not in proc.stderr
    assert "nodes[0] (id 'a').batch: batch.tolerated_failure_count requires error_handling 'continue'" in proc.stderr
    assert "batch.tolerated_failure_percent must be a number from 0 to 100, got -1" in proc.stderr
    assert "batch.tolerated_failure_count must be an integer >= 0, got -2" in proc.stderr
