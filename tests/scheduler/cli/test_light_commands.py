"""Commands that read a run start light: `results` and `wait --output json` of a dataset job load neither
the IR's models (pydantic), the engine, pocketflow, Celery nor Rich, on either store, and `results` of a local job
no redis-py either; `run --items --output json` of a local job loads no Celery, kombu, redis-py, Rich or repair
flow. Start-up was most of what those commands
cost after a dataset job (bench/DATASETS.md).

Real parts only: each command is a `chordflow` subprocess under `python -X importtime`, whose list of imported
modules is read back; the `backend` fixture runs the job locally and on the suite's cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

from ir.models import Priority
from ir.priorities import PRIORITIES
from tests.worker.datasets.test_datasets import ROOT

#: What reading a run never needs: the IR's models, the engine, the repair flow, Celery, Rich.
HEAVY = {"pydantic", "pocketflow", "worker.engine.stepper", "scheduler.api", "scheduler.repair", "celery", "rich"}


def imported(*args: Any) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run `chordflow ARGS`; (the finished process, the modules it imported)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "scheduler.cli", *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "CHORDFLOW_PLUGINS": ""},  # the suite's plugins import nodes (and so the engine)
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    return done, {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}


def echo_job(tmp_path: Path, count: int) -> tuple[Path, Path]:
    wf = tmp_path / "wf.json"
    wf.write_text(
        json.dumps(
            {
                "inputs": {"record": {"description": "one record"}},
                "nodes": [{"id": "a", "type": "echo", "params": {"id": "${record.id}"}}],
                "outputs": {"id": {"source": "${a.id}"}},
            }
        )
    )
    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(count)))
    return wf, records


@pytest.mark.processes
def test_reading_a_dataset_job_loads_no_models_engine_celery_or_rich(backend: str, tmp_path: Path) -> None:
    wf, records = echo_job(tmp_path, 7)
    if backend == "celery":
        started, loaded = imported("submit", wf, "--items", records, "--chunk-size", 3)
        run_id = started.stdout.split()[0]
    else:
        started, loaded = imported("run", wf, "--items", records, "--chunk-size", 3, "--output", "json")
        run_id = json.loads(started.stdout)["run_id"]
        assert "scheduler.datasets.running" in loaded and "pocketflow" in loaded  # the job ran through them
        # no cluster library for a local job, no display for JSON output, no repair flow unasked
        assert sorted(loaded & {"celery", "kombu", "redis", "rich", "scheduler.repair"}) == []
    waited, loaded = imported("wait", run_id, "--output", "json")
    assert json.loads(waited.stdout)["outputs"] == {"total": 7, "done": 7, "failed": 0}
    assert sorted(loaded & HEAVY) == []
    out = tmp_path / "rows.jsonl"
    _, loaded = imported("results", run_id, "--out", out)
    assert [json.loads(line) for line in out.read_text().splitlines()] == [
        {"index": i, "result": {"id": i}, "error": None} for i in range(7)
    ]
    assert sorted(loaded & HEAVY) == []
    if backend == "local":
        assert sorted(loaded & {"redis", "kombu"}) == []


def test_the_priority_words_and_the_models_priority_type_agree() -> None:
    """ir/priorities.py keeps the words apart from the models (so the CLI's --priority needs no pydantic);
    the models' `Priority` type must list the same words, in the same order."""
    assert typing.get_args(Priority) == PRIORITIES
