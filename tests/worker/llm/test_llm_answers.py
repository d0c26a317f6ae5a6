"""Never paying twice for one answer: a model request answered in a run is not sent again in that run — not by a
chunk delivered again after its worker was SIGKILLed, nor by `resume` after the local run's process was SIGKILLed
— and, with a node's `cache`, not by a later run either. Billed requests are counted by the loopback provider
(tests/support/llm_server.py), which the official clients reach over HTTP."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import scheduler
from scheduler import api
from tests.scheduler.cli.test_cli import ROOT, cli_env, run_cli
from tests.support import llm_server
from tests.support.cluster import destroyable_cluster
from tests.support.llm_server import Provider
from tests.worker.cluster.faults.test_long_chunks import until
from worker.runs.sqlite import LocalRuns


def ask_each(items: str = "${items}", **batch: Any) -> dict[str, Any]:
    node = {"id": "ask", "type": "llm", "params": {"prompt": "${item}", "model": "openai/gpt-test"}}
    node["batch"] = {"items": items, **batch}
    return {"nodes": [node]}


def test_a_cached_answer_is_reused_by_a_later_run_and_billed_nothing(provider: Provider) -> None:
    node = {"id": "ask", "type": "llm", "params": {"prompt": "what is 2+2?", "model": "openai/gpt-test"}}
    cached = {"nodes": [{**node, "params": {**node["params"], "cache": "1h"}}]}
    first = scheduler.run(cached)
    second = scheduler.run(cached)
    assert second.shared["ask"]["response"] == first.shared["ask"]["response"] == "echo: what is 2+2?"
    assert len(provider.billed()) == 1
    [entry] = second.shared["__llm_calls__"]
    assert entry["cached"] is True and entry["input_tokens"] == entry["output_tokens"] == 0
    assert first.shared["__llm_calls__"][0]["cached"] is False
    scheduler.run({"nodes": [node]})  # without `cache`: another run pays for its own answer
    assert len(provider.billed()) == 2


@pytest.mark.processes
def test_a_workflow_cache_reaches_every_cluster_item_that_sets_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workflow's `cache` is the default of each llm node's: a second cluster run of 20 items pays for nothing,
    # and a node with its own `cache` keeps it.
    with llm_server.serving(Provider()) as provider:
        for name, value in llm_server.environment(provider).items():
            monkeypatch.setenv(name, value)
        with destroyable_cluster(tmp_path, 5):
            items = [f"p{i}" for i in range(20)]
            workflow = {**ask_each(chunk_size=5), "cache": "1h"}
            first = scheduler.wait(scheduler.submit(workflow, {"items": items}), timeout=60)
            second = scheduler.wait(scheduler.submit(workflow, {"items": items}), timeout=60)
    assert first.status == second.status == "success"
    assert [r["response"] for r in second.shared["ask"]["results"]] == [f"echo: {p}" for p in items]
    assert len(provider.billed()) == len(items)
    assert [c["cached"] for c in second.shared["__llm_calls__"]] == [True] * len(items)


@pytest.mark.processes
def test_a_bad_cache_duration_is_one_validation_line(provider: Provider, tmp_path: Path) -> None:
    wf = tmp_path / "wf.json"
    node = {"id": "ask", "type": "llm", "params": {"prompt": "p", "model": "openai/gpt-test", "cache": "a week"}}
    wf.write_text(json.dumps({"nodes": [node]}))
    proc = run_cli("validate", wf)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "params.cache: must be a duration like 7d, 12h, 30m or 90s, got 'a week'" in proc.stderr
    wf.write_text(json.dumps({"nodes": [{**node, "params": {"prompt": "p", "model": "fake"}}], "cache": "soon"}))
    proc = run_cli("validate", wf)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "cache: must be a duration like 7d, 12h, 30m or 90s, got 'soon'" in proc.stderr, proc.stderr


def run_named(name: str) -> str | None:
    return next((r.run_id for r in LocalRuns.default().recent(None, 50) if r.workflow.get("name") == name), None)


def answers_kept(run_id: str) -> int:
    """The answers a local run's store holds (worker/runs/sqlite.py LocalAnswers)."""
    runs = LocalRuns.default()
    with runs.lock:
        return runs.db.execute("SELECT count(*) FROM answers WHERE run_id = ?", (run_id,)).fetchone()[0]


@pytest.mark.processes
def test_resume_after_a_sigkill_pays_for_no_answer_twice(tmp_path: Path) -> None:
    # A parallel local batch of 20: the answer to item 0 is held by the provider, so no outcome can be checkpointed
    # (checkpoints keep contiguous outcomes) while items 1-19 are answered. SIGKILL the run, then resume it: the
    # answers it received are found in the run's store, only item 0 is asked again (its first request was in flight).
    with llm_server.serving(Provider(held={"p0"})) as provider:
        env = {**cli_env(), **llm_server.environment(provider)}
        env.pop("CHORDFLOW_LLM_MODEL", None)
        wf = tmp_path / "wf.json"
        items = [f"p{i}" for i in range(20)]
        name = f"resume-{uuid.uuid4().hex[:8]}"
        workflow = {**ask_each(parallel=True, max_concurrent=4), "name": name, "inputs": {"items": {"default": items}}}
        wf.write_text(json.dumps(workflow))
        command = [sys.executable, "-m", "scheduler.cli", "run", str(wf)]
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            run_id = until(lambda: run_named(name), 60, "the run recorded")
            until(lambda: answers_kept(run_id) == 19, 60, "items 1-19 answered and kept")
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=30)
        finally:
            proc.kill()
        provider.release.set()  # the held request's answer goes to a dead process: billed, never received
        until(lambda: len(provider.billed()) == 20, 30, "the held answer billed")
        resumed = subprocess.run([*command[:3], "resume", run_id], cwd=ROOT, env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "ask: 20 items, 20 succeeded, 0 failed" in resumed.stdout
    assert len(provider.billed()) == 21, provider.billed()  # 20 answers, and item 0's twice (in flight at the kill)


@pytest.mark.processes
def test_a_chunk_delivered_again_after_a_sigkill_pays_for_no_answer_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 120 items in chunks of 30 on two workers, each answer taking 50 ms. SIGKILL one worker mid-chunk: its chunk is
    # delivered again (the dead-delivery bound, 5 s here) and finds the answers the dead delivery kept.
    with llm_server.serving(Provider(delay=0.05)) as provider:
        for name, value in llm_server.environment(provider).items():  # the workers' environment is this one's
            monkeypatch.setenv(name, value)
        with destroyable_cluster(tmp_path, 5) as cluster:
            items = [f"p{i}" for i in range(120)]
            run_id = scheduler.submit(ask_each(chunk_size=30), {"items": items})
            until(lambda: len(provider.requests) >= 45, 60, "a third of the answers")
            next(iter(cluster.workers.values())).kill(signal.SIGKILL)
            killed = time.monotonic()
            result = scheduler.wait(run_id, timeout=180)
    assert result.status == "success", result.error
    assert [r["response"] for r in result.shared["ask"]["results"]] == [f"echo: {p}" for p in items]
    billed = len(provider.billed())
    assert billed <= 1.02 * len(items), f"{billed} requests billed for {len(items)} answers"
    print(f"{billed} requests billed for {len(items)} answers; the run ended {time.monotonic() - killed:.1f}s after")


@pytest.mark.processes
def test_cancel_then_resume_pays_for_no_answer_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 120 items in chunks of 30 on two workers, answers of 50 ms: cancel a third of the way, resume, and the run
    # ends with every answer, each billed once (but for one in flight at the cancel).
    with llm_server.serving(Provider(delay=0.05)) as provider:
        for name, value in llm_server.environment(provider).items():
            monkeypatch.setenv(name, value)
        with destroyable_cluster(tmp_path, 5):
            items = [f"p{i}" for i in range(120)]
            run_id = scheduler.submit(ask_each(chunk_size=30), {"items": items})
            until(lambda: len(provider.requests) >= 40, 60, "a third of the answers")
            api.cancel(run_id)
            assert scheduler.wait(run_id, timeout=60).status == "cancelled"
            cancelled_at = len(provider.billed())
            api.resume_cluster(run_id)
            result = scheduler.wait(run_id, timeout=120)
    assert result.status == "success", result.error
    assert [r["response"] for r in result.shared["ask"]["results"]] == [f"echo: {p}" for p in items]
    billed = len(provider.billed())
    assert billed <= 1.02 * len(items), f"{billed} requests billed for {len(items)} answers"
    print(f"cancel after {cancelled_at} answers, resume: {billed} requests billed for {len(items)} answers")
