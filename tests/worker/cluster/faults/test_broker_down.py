"""The celery backend with no Redis at the broker URL: one clear error at once, never the worker hint."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

import scheduler
from ir.errors import BackendError
from scheduler.localcluster import free_port

WORKFLOW = '{"nodes": [{"id": "b", "type": "echo", "params": {"v": "${item}"}, "batch": {"items": "${items}"}}]}'


@pytest.mark.parametrize("form", ["run", "submit --items"])
@pytest.mark.processes
def test_cli_run_with_nothing_at_the_broker_url_fails_at_once(form: str, tmp_path: Path) -> None:
    """A workflow run, and a dataset job's submit (which once skipped the PING and rode out the outage budget
    before failing with a lost connection)."""
    port = free_port()  # nothing listens there
    url = f"redis://:s3cret@127.0.0.1:{port}/0"
    wf = tmp_path / "wf.json"
    wf.write_text(WORKFLOW)
    records = tmp_path / "records.jsonl"
    records.write_text('{"id": 1}\n')
    env = {**os.environ, "CHORDFLOW_BROKER_URL": url, "CHORDFLOW_RESULT_BACKEND": url, "CHORDFLOW_HOME": str(tmp_path)}
    env["CHORDFLOW_SECRET_KEY"] = secrets.token_hex(32)  # signed, as a cluster client is: the broker is what fails
    how = ["run", str(wf), "--input", "items=[1,2,3]", "--backend", "celery"]
    if form == "submit --items":
        how = ["submit", str(wf), "--items", str(records)]
    argv = [sys.executable, "-m", "scheduler.cli", *how]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith(f"error: cannot reach Redis at redis://:**@127.0.0.1:{port}/0 ("), errors[0]
    assert "s3cret" not in proc.stderr
    assert "no chordflow worker" not in proc.stderr  # the broker is down, not the workers
    assert "Traceback" not in proc.stderr


def test_scheduler_run_raises_backend_error_before_dispatching(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setenv("CHORDFLOW_BROKER_URL", url)
    monkeypatch.setenv("CHORDFLOW_RESULT_BACKEND", url)
    monkeypatch.setenv("CHORDFLOW_HOME", str(tmp_path))
    with pytest.raises(BackendError, match=rf"^cannot reach Redis at {url} \(.*refused"):
        scheduler.run(WORKFLOW, {"items": [1]}, backend="celery")
