"""Local runs whose process goes away: a SIGKILLed owner reads as failed and resumes from its last
checkpoint; SIGTERM ends a run as cancelled like Ctrl-C; a batch cut short keeps its outcomes in chunks.

Every run here is a real `chordflow run` process, killed or interrupted with a real signal once a gate file or
the embedded store says it is where the test wants it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import scheduler
from ir.errors import TemplateError
from tests.scheduler.cli.test_cli import ROOT, cli_env, run_cli
from tests.worker.runs.test_checkpoints import lines, side_effect, until
from worker.batch.aggregate import ChunkResult
from worker.batch.checkpoints import Checkpoints
from worker.batch.outcome import ItemOutcome
from worker.runs.sqlite import LocalRuns


def start_run(wf: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "run", str(wf), *args], cwd=ROOT, env=cli_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def run_of(marker: Path) -> str:
    """The id of the run (any status) whose workflow names `marker` (a file only this test uses)."""
    runs = LocalRuns.default()
    return until(lambda: [r.run_id for r in runs.recent(None, 100) if str(marker) in json.dumps(r.workflow)])[0]


def gated_three(tmp_path: Path) -> tuple[Path, Path, Path]:
    """n1, then n2 held until the file `gate` exists, then n3: (workflow file, log, gate)."""
    log, gate = tmp_path / "log", tmp_path / "gate"
    wf = tmp_path / "wf.json"
    nodes = [side_effect("n1", log), side_effect("n2", log, gate=str(gate)), side_effect("n3", log)]
    wf.write_text(json.dumps({"name": "gated", "nodes": nodes}))
    return wf, log, gate


@pytest.mark.processes
def test_a_sigkilled_run_reads_failed_everywhere_and_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    wf, log, gate = gated_three(tmp_path)
    proc = start_run(wf)
    try:
        run_id = run_of(gate)
        until(lambda: LocalRuns.default().get(run_id).step == 1)  # n1 checkpointed, n2 held at its gate
        waiting = subprocess.Popen(
            [sys.executable, "-m", "scheduler.cli", "wait", run_id], cwd=ROOT, env=cli_env(),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        try:
            _, waited_err = waiting.communicate(timeout=60)  # a wait going on when the process died ends too
        finally:
            waiting.kill()
    finally:
        proc.kill()
    gone = f"the process running it (pid {proc.pid}) is gone"
    assert waiting.returncode == 1 and gone in waited_err, waited_err
    status = json.loads(run_cli("status", run_id, "--json").stdout)
    assert (status["status"], status["error"], status["node"]) == ("failed", f"{gone} (node 'n2')", "n2")
    listed = {r["run_id"]: r for r in json.loads(run_cli("runs", "--json", "--limit", "50").stdout)}
    assert listed[run_id]["status"] == "failed"
    waited = run_cli("wait", run_id, timeout=60)
    assert waited.returncode == 1 and gone in waited.stderr, waited.stderr
    cancel = run_cli("cancel", run_id)
    assert cancel.returncode == 2 and f"run {run_id} already ended: failed" in cancel.stderr
    gate.touch()
    resumed = run_cli("resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert "↻ cached n1" in resumed.stderr and "status: success" in resumed.stdout
    assert lines(log) == ["n1", "n2", "n3"]  # n1 ran once
    assert LocalRuns.default().get(run_id).status == "succeeded"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
@pytest.mark.processes
def test_sigterm_and_sighup_end_a_local_run_as_cancelled_and_it_resumes(tmp_path: Path, signum: int) -> None:
    wf, log, gate = gated_three(tmp_path)
    proc = start_run(wf)
    try:
        run_id = run_of(gate)
        until(lambda: LocalRuns.default().get(run_id).step == 1)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "cancelled" in err and "Traceback" not in err, err
    record = LocalRuns.default().get(run_id)
    assert (record.status, record.error) == ("cancelled", "run cancelled")
    gate.touch()
    resumed = run_cli("resume", run_id)
    assert resumed.returncode == 0 and "↻ cached n1" in resumed.stderr, resumed.stderr
    assert lines(log) == ["n1", "n2", "n3"]


def test_a_run_failing_while_resolving_its_outputs_ends_failed() -> None:
    wf = {"nodes": [{"id": "e", "type": "echo", "params": {"v": 1}}], "outputs": {"x": {"source": "${e.nope}"}}}
    with pytest.raises(TemplateError):
        scheduler.run(wf, run_id="outputs-fail-1")
    record = LocalRuns.default().get("outputs-fail-1")
    assert record.status == "failed" and "TemplateError" in record.error and "nope" in record.error


@pytest.mark.processes
def test_a_run_of_a_live_process_stays_running(tmp_path: Path) -> None:
    """The control for the tests above: a reader does not take a live owner for a gone one."""
    wf, _, gate = gated_three(tmp_path)
    proc = start_run(wf)
    try:
        run_id = run_of(gate)
        until(lambda: LocalRuns.default().get(run_id).step == 1)
        assert json.loads(run_cli("status", run_id, "--json").stdout)["status"] == "running"
        gate.touch()
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert LocalRuns.default().get(run_id).status == "succeeded"


def held_batch(tmp_path: Path, n: int, ran: int, **batch: Any) -> tuple[Path, Path, Path]:
    """A batch node `b` of `n` items whose first `ran` run at once and the rest wait for the file `gate` (an
    item's own `gate` param): (workflow file, log of the items that ran, gate)."""
    log, gate, open_ = tmp_path / "log", tmp_path / "gate", tmp_path / "open"
    open_.touch()
    items = [{"i": i, "gate": str(open_ if i < ran else gate)} for i in range(n)]
    node = side_effect("b", log, label="${item.i}", gate="${item.gate}")
    node["batch"] = {"items": "${items}", **batch}
    wf = tmp_path / "batch.json"
    wf.write_text(json.dumps({"name": "held-batch", "nodes": [node], "inputs": {"items": {"default": items}}}))
    return wf, log, gate


def kept_items(run_id: str) -> int:
    return sum(len(c.results) for c in LocalRuns.default().saved_chunks(run_id, "b#0"))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
@pytest.mark.processes
def test_a_local_batch_cut_short_keeps_what_finished_and_resumes_with_it(tmp_path: Path, signum: int) -> None:
    wf, log, gate = held_batch(tmp_path, 40, 10)
    proc = start_run(wf)
    try:
        run_id = run_of(gate)
        until(lambda: len(lines(log)) == 10)  # items 0-9 done, item 10 waits for the gate
        if signum == signal.SIGKILL:  # nothing runs at the end: only what the checkpoints wrote as it went
            until(lambda: kept_items(run_id) == 10)
        proc.send_signal(signum)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == (130 if signum == signal.SIGINT else -signal.SIGKILL)
    assert kept_items(run_id) == 10
    rows = [json.loads(line) for line in run_cli("results", run_id, "--node", "b").stdout.splitlines()]
    assert [r["index"] for r in rows] == list(range(10)) and rows[3]["result"] == {"label": "3"}
    gate.touch()
    resumed = run_cli("resume", run_id)
    assert resumed.returncode == 0, resumed.stderr
    assert "↻ cached 10 items of batch node b (from the checkpoint)" in resumed.stderr
    assert "b: 40 items, 40 succeeded, 0 failed" in resumed.stdout
    assert sorted(map(int, lines(log))) == list(range(40))  # every item ran once overall
    assert kept_items(run_id) == 0  # the aggregate is in the store: the kept chunks went


@pytest.mark.processes
def test_results_lists_the_items_of_a_local_batch_stopped_by_its_failure_threshold(tmp_path: Path) -> None:
    log, fixed, ok = tmp_path / "log", tmp_path / "fixed", tmp_path / "ok"
    ok.touch()
    node = side_effect("b", log, label="${item.i}", requires="${item.requires}")
    node["batch"] = {"items": "${items}", "error_handling": "continue", "tolerated_failure_count": 2}
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({"nodes": [node]}))
    items = json.dumps([{"i": i, "requires": str(ok if i < 5 else fixed)} for i in range(20)])
    ran = run_cli("run", wf, "--input", f"items={items}", "--output", "json")
    assert ran.returncode == 1, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]
    rows = [json.loads(line) for line in run_cli("results", run_id, "--node", "b").stdout.splitlines()]
    assert [r["index"] for r in rows] == list(range(8))  # stopped at the third failure
    errors = [json.loads(line) for line in run_cli("results", run_id, "--node", "b", "--errors").stdout.splitlines()]
    assert [e["index"] for e in errors] == [5, 6, 7] and f"missing {fixed}" == errors[0]["error"]
    fixed.touch()  # the cause is fixed: a resume runs the failed items again
    resumed = run_cli("resume", run_id)
    assert resumed.returncode == 0 and "b: 20 items, 20 succeeded, 0 failed" in resumed.stdout, resumed.stderr


def test_checkpoints_keep_outcomes_finished_out_of_order_as_one_contiguous_chunk() -> None:
    """A parallel slice finishes items out of order: only the contiguous run from the slice's start is kept."""
    kept: list[ChunkResult] = []
    checkpoints = Checkpoints(10, 5, kept.extend)
    for index in (12, 11, 14, 10):  # 13 never finishes (the slice was cut short)
        checkpoints.after_item(ItemOutcome(index, result=index))
    checkpoints.close()
    assert kept and kept[0].start == 10
    assert [r for chunk in kept for r in chunk.results] == [10, 11, 12]


@pytest.mark.processes
def test_status_of_a_running_local_batch_shows_its_done_total_and_failed(tmp_path: Path) -> None:
    wf, _, gate = held_batch(tmp_path, 40, 10)
    proc = start_run(wf)
    try:
        run_id = run_of(gate)
        counts = {"total": 40, "done": 10, "failed": 0}
        until(lambda: json.loads(run_cli("status", run_id, "--json").stdout)["batches"].get("b") == counts)
        text = run_cli("status", run_id).stdout
        assert f"run {run_id}: running" in text and "b: 10/40 items, 0 failed" in text, text
        gate.touch()
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
    assert json.loads(run_cli("status", run_id, "--json").stdout)["batches"]["b"] == {
        "total": 40, "done": 40, "failed": 0,
    }  # fmt: skip


@pytest.mark.processes
def test_cancel_of_a_local_run_stops_the_process_running_it_as_ctrl_c_does(tmp_path: Path) -> None:
    wf, log, gate = gated_three(tmp_path)
    proc = start_run(wf)
    try:
        run_id = run_of(gate)
        until(lambda: LocalRuns.default().get(run_id).step == 1)
        cancel = run_cli("cancel", run_id)
        assert cancel.returncode == 0 and f"cancel requested for run {run_id}" in cancel.stdout, cancel.stderr
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "cancelled" in err, err
    assert LocalRuns.default().get(run_id).status == "cancelled"
    assert lines(log) == ["n1"]


@pytest.mark.processes
def test_local_repair_fixes_a_node_and_then_the_outputs_of_one_workflow(tmp_path: Path) -> None:
    """The run failing while resolving its outputs ends failed (it stayed `running`), so the repair goes on."""
    wf = tmp_path / "two.json"
    nodes = [{"id": "a", "type": "echo", "params": {"v": 1}}, {"id": "b", "type": "echo", "params": {"w": "${a.vv}"}}]
    edges = [{"from": "a", "to": "b"}]
    wf.write_text(json.dumps({"nodes": nodes, "edges": edges, "outputs": {"x": {"source": "${b.ww}"}}}))
    repaired = run_cli("run", wf, "--repair", "--repair-out", tmp_path / "fixed.json")
    assert repaired.returncode == 0, repaired.stderr
    assert "repair: attempt 2: TemplateError: outputs.x" in repaired.stderr and "x = 1" in repaired.stdout
