"""Idempotent submit (`chordflow submit --idempotency-key KEY`, `scheduler.submit(..., idempotency_key=KEY)`), with a
real redis-server and real workers: a retried submit returns the first run and starts nothing; two submits racing
with one key (two real processes) start one run; a key reused for something else is one line naming the run."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import scheduler
from ir.errors import IdempotencyConflict, ValidationError
from scheduler.localcluster import Cluster
from tests.scheduler.cli.test_cli import assert_one_line_error
from tests.scheduler.test_durable import ROOT, cli, lines, side_effect, write_wf
from tests.support.cluster import PLUGINS
from worker.cluster.state.keys import RUNS, idempotency_key
from worker.cluster.state.runstate import client


def runs_recorded() -> int:
    return int(client().zcard(RUNS))


def test_a_repeated_submit_with_the_same_key_returns_the_first_run_and_starts_nothing(
    celery_cluster: Cluster, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    wf = write_wf(tmp_path, {"nodes": [side_effect("once", log)]})
    key = f"order-{uuid.uuid4().hex}"
    first = cli(celery_cluster, "submit", wf, "--idempotency-key", key)
    assert first.returncode == 0, first.stderr
    run_id = first.stdout.strip()
    assert scheduler.wait(run_id, timeout=60).status == "success"
    before = runs_recorded()
    again = cli(celery_cluster, "submit", wf, "--idempotency-key", key)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout  # printed the same way: the id alone
    assert f"note: idempotency key '{key}' was used by run {run_id}" in again.stderr
    assert runs_recorded() == before  # no record written
    assert scheduler.submit(str(wf), idempotency_key=key) == run_id  # the Python API agrees
    assert runs_recorded() == before
    assert lines(log) == ["once"]  # the node ran once: nothing was enqueued again
    assert scheduler.status(run_id)["status"] == "succeeded"


def test_two_processes_submitting_with_one_key_at_once_start_one_run(celery_cluster: Cluster, tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    wf = write_wf(tmp_path, {"nodes": [side_effect("once", log)]})
    key = f"race-{uuid.uuid4().hex}"
    before = runs_recorded()
    env = {**celery_cluster.env, "CHORDFLOW_PLUGINS": PLUGINS}
    command = [sys.executable, "-m", "scheduler.cli", "submit", str(wf), "--idempotency-key", key]
    procs = [subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    procs.append(
        subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    )
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    ids = {out.strip() for out, _ in outs}
    assert len(ids) == 1, outs  # both print the same run
    run_id = ids.pop()
    assert sum("note: idempotency key" in err for _, err in outs) == 1, outs  # exactly one was the repeat
    assert scheduler.wait(run_id, timeout=60).status == "success"
    assert runs_recorded() == before + 1
    assert lines(log) == ["once"]


def test_a_used_key_with_other_inputs_is_one_line_naming_the_existing_run(
    celery_cluster: Cluster, tmp_path: Path
) -> None:
    echo = {"id": "e", "type": "echo", "params": {"v": "${n}"}}
    wf = write_wf(tmp_path, {"inputs": {"n": {"required": True}}, "nodes": [echo]})
    key = f"inputs-{uuid.uuid4().hex}"
    run_id = scheduler.submit(str(wf), {"n": 1}, idempotency_key=key)
    assert scheduler.submit(str(wf), {"n": 1}, idempotency_key=key) == run_id
    before = runs_recorded()
    with pytest.raises(IdempotencyConflict, match=f"idempotency key '{key}' was used by run {run_id}"):
        scheduler.submit(str(wf), {"n": 2}, idempotency_key=key)
    other = write_wf(tmp_path, {"nodes": [{"id": "e", "type": "echo", "params": {"v": 1}}]}, "other.json")
    error = assert_one_line_error(cli(celery_cluster, "submit", other, "--idempotency-key", key), 2)
    assert f"was used by run {run_id} with another workflow or other inputs" in error
    assert runs_recorded() == before
    assert "idempotency key: 1 to 255 characters, got 0" in assert_one_line_error(
        cli(celery_cluster, "submit", other, "--idempotency-key", ""), 2
    )
    with pytest.raises(ValidationError, match="a dataset job"):
        scheduler.submit(str(wf), items=[1, 2], idempotency_key=key)


def test_a_key_whose_run_was_purged_or_never_recorded_starts_a_new_run(celery_cluster: Cluster, tmp_path: Path) -> None:
    log = tmp_path / "effects.log"
    wf = write_wf(tmp_path, {"nodes": [side_effect("n", log)]})
    key = f"purged-{uuid.uuid4().hex}"
    first = scheduler.submit(str(wf), idempotency_key=key)
    assert scheduler.wait(first, timeout=60).status == "success"
    assert cli(celery_cluster, "purge", first).returncode == 0
    second = scheduler.submit(str(wf), idempotency_key=key)  # the claim names no run: taken over after settling
    assert second != first
    assert scheduler.wait(second, timeout=60).status == "success"
    assert scheduler.submit(str(wf), idempotency_key=key) == second
    client().set(idempotency_key(key), "dead00000000 whatever")  # a submit killed between its claim and its record
    third = scheduler.submit(str(wf), idempotency_key=key)
    assert third not in (second, "dead00000000")
    assert scheduler.wait(third, timeout=60).status == "success"
    assert lines(log) == ["n", "n", "n"]
