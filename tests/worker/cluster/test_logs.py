"""Logs an operator can use: one line per chunk and per run transition, with the run id, the
node and the counts; with CHORDFLOW_LOG_FORMAT=json every line of a worker is one JSON object; secrets never show.

Real worker processes of the suite's cluster (tests/support/cluster.py): a JSON worker of its own, on a queue of
its own so that it runs every task of its runs, and the suite's two text workers.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import scheduler
from scheduler.localcluster import Cluster, ManagedProcess
from tests.scheduler.cli.test_cli import ROOT
from tests.support.kinds import starts
from worker import redact

JSON_QUEUE = "logs-json"


@pytest.fixture
def token() -> Iterator[str]:
    yield f"tok-{uuid.uuid4().hex}"
    redact.forget()


@pytest.fixture
@starts("cluster")
def json_worker(celery_cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ManagedProcess]:
    """`chordflow worker -P prefork -c 2` with CHORDFLOW_LOG_FORMAT=json, alone on JSON_QUEUE; this process
    submits there too."""
    env = {**celery_cluster.env, "CHORDFLOW_LOG_FORMAT": "json", "CHORDFLOW_QUEUE": JSON_QUEUE}
    argv = celery_cluster.worker_argv("logs", pool="prefork", concurrency=2, via="chordflow")
    worker = ManagedProcess(argv, tmp_path / "worker-logs.log", "ready.", env=env)
    monkeypatch.setenv("CHORDFLOW_QUEUE", JSON_QUEUE)
    try:
        yield worker
    finally:
        worker.kill(signal.SIGKILL)


def secret_run(token: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A batch whose items echo a `password` param in their errors, then a node that raises with an `api_token`."""
    bad = {"id": "bad", "type": "test-error-string", "params": {"value": "${item}", "password": "${item}"},
           "batch": {"items": "${codes}", "error_handling": "continue", "chunk_size": 1}}  # fmt: skip
    boom = {
        "id": "boom",
        "type": "test-fail",
        "params": {"value": "${api_token}", "api_token": "${api_token}", "fail": True},
    }
    return {"name": "logs-secret", "nodes": [bad, boom]}, {"codes": [token, "x", "y"], "api_token": token}


def test_a_json_worker_writes_one_object_per_line_with_chunk_and_run_fields(
    json_worker: ManagedProcess, token: str
) -> None:
    wf, inputs = secret_run(token)
    run_id = scheduler.submit(wf, inputs)
    with pytest.raises(ValueError, match=r"^boom \*\*\*$"):
        scheduler.wait(run_id, timeout=60)
    json_worker.wait_for_line(f"run {run_id}: running -> failed")
    json_worker.kill(signal.SIGTERM)  # a warm shutdown: every line it had to write is in the log
    text = json_worker.log.read_text()

    assert token not in text and token.encode().hex() not in text
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]  # each line one JSON object
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert any(line["logger"] == "celery.app.trace" for line in lines)  # Celery's own lines: JSON too
    assert any(line["message"] == "worker: Warm shutdown (MainProcess)" for line in lines)  # even its notices

    chunks = sorted((line for line in lines if line.get("event") == "chunk"), key=lambda line: line["start"])
    assert [(c["run"], c["node"], c["start"], c["items"], c["failed"]) for c in chunks] == [
        (run_id, "bad", 0, 1, 1),
        (run_id, "bad", 1, 1, 1),
        (run_id, "bad", 2, 1, 1),
    ]
    assert all(
        c["batch"].startswith("bad#") and c["seconds"] >= 0 and c["task"] == "chordflow.run_chunk" for c in chunks
    )
    assert chunks[0]["message"].startswith(f"chunk run={run_id} node=bad batch=bad#")

    moves = [line for line in lines if line.get("event") == "run" and line["run"] == run_id]
    assert [(m["from"], m["to"]) for m in moves] == [("queued", "running"), ("running", "failed")]
    ended = moves[-1]
    assert (ended["node"], ended["steps"], ended["items"], ended["failed"]) == ("boom", 1, 3, 3)
    assert ended["error"] == "ValueError: boom ***" and ended["level"] == "WARNING"
    assert ended["task"] == "chordflow.advance"


def test_text_workers_write_the_same_lines(celery_cluster: Cluster) -> None:
    wf = {"name": "logs-text", "nodes": [{"id": "b", "type": "echo", "params": {"v": "${item}"},
                                          "batch": {"items": "${items}", "chunk_size": 2}}]}  # fmt: skip
    run_id = scheduler.submit(wf, {"items": [1, 2, 3, 4]})
    assert scheduler.wait(run_id, timeout=60).status == "success"
    logs = [celery_cluster.workdir / f"worker-{name}.log" for name in celery_cluster.workers]
    wanted = f"run {run_id}: running -> succeeded node=b steps=1 items=4 failed=0"
    deadline = time.monotonic() + 30
    while not any(wanted in log.read_text() for log in logs):  # written just after the run's record says it ended
        assert time.monotonic() < deadline, wanted
        time.sleep(0.05)
    text = "".join(log.read_text() for log in logs)
    assert f"run {run_id}: queued -> running node=b steps=0" in text
    assert f"chunk run={run_id} node=b batch=b#0 items[0:2] items=2 failed=0 seconds=" in text
    assert f"chunk run={run_id} node=b batch=b#0 items[2:4] items=2 failed=0 seconds=" in text


def test_an_unknown_log_format_stops_the_worker_with_one_line(celery_cluster: Cluster) -> None:
    argv = celery_cluster.worker_argv("badformat", via="chordflow")
    env = {**celery_cluster.env, "CHORDFLOW_LOG_FORMAT": "xml"}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == "error: CHORDFLOW_LOG_FORMAT must be 'text' or 'json', got 'xml'"
