"""`--out FILE` of `wait` and `run` on a dataset job: its rows written to FILE as the job runs.

Real parts only: the `backend` fixture runs each test locally and on the suite's cluster (real redis-server, real
workers); every command is a `chordflow` subprocess. FILE must hold the bytes `results RUN --out FILE` writes,
appear only once the job succeeded, and fill while the records still run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli.output import to_json
from tests.scheduler.test_durable import until
from tests.worker.datasets.test_datasets import ROOT, backend_args, cli, per_record_workflow, write_records


def results_file(run_id: str, path: Path) -> bytes:
    done = cli("results", run_id, "--out", path)
    assert done.returncode == 0, done.stderr
    return path.read_bytes()


def leftovers(directory: Path, name: str) -> list[str]:
    """Temp files of FILE `name` left in `directory` (`.name.*.part`)."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(f".{name}."))


@pytest.fixture
def job(tmp_path: Path) -> dict[str, Path]:
    log = tmp_path / "log.txt"
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(per_record_workflow(log)))
    return {"wf": wf, "log": log, "missing": tmp_path / "flag", "out": tmp_path / "out" / "rows.jsonl"}


@pytest.mark.processes
def test_run_out_is_results_out_byte_for_byte_failed_record_included(backend: str, job: dict, tmp_path: Path) -> None:
    items = tmp_path / "items.jsonl"  # non-ASCII ids: the rows hold them as they are, not as \u escapes
    records = ({"id": f"r{i}-é☃", "requires": str(job["missing"]) if i == 13 else ""} for i in range(57))
    items.write_text("".join(json.dumps(record) + "\n" for record in records))
    job["out"].parent.mkdir()
    done = cli(
        "run", job["wf"], "--items", items, "--chunk-size", 5, "--tolerated-failure-count", 1, "--output", "json",
        "--out", job["out"], *backend_args(backend),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    written = job["out"].read_bytes()
    assert written == results_file(run_id, tmp_path / "results.jsonl")
    rows = [json.loads(line) for line in written.splitlines()]
    assert [r["index"] for r in rows] == list(range(57))  # input order, whatever order the chunks ended in
    # each line is what `to_json(row)` prints (written a chunk at a time, not row by row), the same rows as JSON
    assert [line.decode() for line in written.splitlines()] == [to_json(row) for row in rows]
    assert rows == json.loads(cli("results", run_id, "--format", "json").stdout)
    assert rows[13]["result"] is None and "missing" in rows[13]["error"]
    assert rows[14] == {"index": 14, "result": {"label": "r14-é☃", "upper": "R14-É☃"}, "error": None}
    assert "é☃" in written.decode()
    assert leftovers(job["out"].parent, "rows.jsonl") == []


@pytest.mark.processes
def test_wait_out_writes_a_jobs_rows_on_either_backend(backend: str, job: dict, tmp_path: Path) -> None:
    items = write_records(tmp_path / "items.jsonl", 23)
    job["out"].parent.mkdir()
    if backend == "celery":  # submitted: `wait --out` follows it from the start
        started = cli("submit", job["wf"], "--items", items, "--chunk-size", 4)
        assert started.returncode == 0, started.stderr
        run_id = started.stdout.split()[0]
    else:  # a local job runs in the process that started it: another one's `wait --out` reads what it stored
        started = cli("run", job["wf"], "--items", items, "--chunk-size", 4, "--output", "json")
        assert started.returncode == 0, started.stderr
        run_id = json.loads(started.stdout)["run_id"]
    waited = cli("wait", run_id, "--output", "json", "--out", job["out"])
    assert waited.returncode == 0, waited.stderr
    assert json.loads(waited.stdout)["outputs"] == {"total": 23, "done": 23, "failed": 0}
    assert job["out"].read_bytes() == results_file(run_id, tmp_path / "results.jsonl")
    assert len(job["out"].read_bytes().splitlines()) == 23


@pytest.mark.processes
def test_a_failed_run_leaves_file_as_it_was_and_no_temp_file(backend: str, job: dict, tmp_path: Path) -> None:
    items = write_records(tmp_path / "items.jsonl", 30, job["missing"], failing=(2, 17))
    job["out"].parent.mkdir()
    job["out"].write_text("before\n")
    done = cli(
        "run", job["wf"], "--items", items, "--chunk-size", 5, "--output", "json", "--out", job["out"],
        *backend_args(backend),
    )  # fmt: skip
    assert done.returncode == 1  # the exit code of the same run without --out
    assert "failed 2 of 30 records" in done.stderr
    assert job["out"].read_text() == "before\n"
    assert leftovers(job["out"].parent, "rows.jsonl") == []
    run_id = json.loads(done.stdout)["run_id"]
    waited = cli("wait", run_id, "--out", tmp_path / "waited.jsonl")
    assert waited.returncode == 1 and not (tmp_path / "waited.jsonl").exists()


@pytest.mark.processes
def test_rows_reach_the_temp_file_in_order_while_a_record_still_runs_and_file_only_at_the_end(
    backend: str, job: dict, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    wf = per_record_workflow(job["log"], gated=True)
    job["wf"].write_text(json.dumps(wf))
    items = tmp_path / "items.jsonl"
    records = ({"id": f"r{i}", "requires": "", "gate": str(gate) if i == 17 else ""} for i in range(25))
    items.write_text("".join(json.dumps(record) + "\n" for record in records))
    job["out"].parent.mkdir()
    job_args = ["--items", items, "--chunk-size", 5]
    run_id = None
    if backend == "celery":  # submitted, so that this test knows the run and sees its chunks end
        started = cli("submit", job["wf"], *job_args)
        assert started.returncode == 0, started.stderr
        run_id = started.stdout.split()[0]
        argv = ["wait", run_id, "--output", "json", "--out", job["out"]]
    else:
        argv = ["run", job["wf"], *job_args, "--output", "json", "--out", job["out"]]
    following = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", *map(str, argv)],
        cwd=ROOT, env={**os.environ, "COLUMNS": "200"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:

        def temp_rows() -> int:
            found = leftovers(job["out"].parent, "rows.jsonl")
            return len((job["out"].parent / found[0]).read_bytes().splitlines()) if found else 0

        # records 15-19 (chunk 3) wait for the gate: chunks 0-2 are written meanwhile, not chunk 4 after it
        until(lambda: temp_rows() >= 15, 60, "the rows of chunks 0-2 in the temp file")
        if run_id is not None:  # the other worker ran chunk 4: it waits for chunk 3
            from worker.cluster.datasets.store import ClusterDataset

            until(lambda: ClusterDataset(run_id).outcomes([4])[0] is not None, 60, "chunk 4's outcomes")
        assert temp_rows() == 15
        assert not job["out"].exists()
    finally:
        gate.write_text("open")
        stdout, stderr = following.communicate(timeout=120)
    assert following.returncode == 0, stderr
    run_id = json.loads(stdout)["run_id"]
    assert job["out"].read_bytes() == results_file(run_id, tmp_path / "results.jsonl")
    assert leftovers(job["out"].parent, "rows.jsonl") == []


def test_wait_out_past_its_timeout_leaves_no_file(celery_cluster: Any, job: dict, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    wf = per_record_workflow(job["log"])
    wf["nodes"][0]["params"]["gate"] = str(gate)
    job["wf"].write_text(json.dumps(wf))
    items = write_records(tmp_path / "items.jsonl", 3)
    started = cli("submit", job["wf"], "--items", items)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.split()[0]
    try:
        waited = cli("wait", run_id, "--timeout", 0.5, "--out", tmp_path / "rows.jsonl")
        assert waited.returncode == 124, waited.stderr
        assert not (tmp_path / "rows.jsonl").exists() and leftovers(tmp_path, "rows.jsonl") == []
    finally:
        gate.write_text("open")
    assert cli("wait", run_id, "--out", tmp_path / "rows.jsonl").returncode == 0
    assert len((tmp_path / "rows.jsonl").read_bytes().splitlines()) == 3


@pytest.mark.processes
def test_out_of_a_run_that_is_no_dataset_job_is_a_one_line_usage_error(job: dict, tmp_path: Path) -> None:
    wf = tmp_path / "plain.json"
    wf.write_text(json.dumps({"nodes": [{"id": "u", "type": "test-upper", "params": {"text": "a"}}]}))
    refused = cli("run", wf, "--out", tmp_path / "rows.jsonl")
    assert refused.returncode == 2
    assert refused.stderr == (
        f"error: --out: {wf} is not a dataset job (--items); `chordflow results RUN --out FILE` writes a run's "
        "outputs\n"
    )
    ran = cli("run", wf, "--output", "json")
    run_id = json.loads(ran.stdout)["run_id"]
    refused = cli("wait", run_id, "--out", tmp_path / "rows.jsonl")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "is not a dataset job" in refused.stderr
    detached = cli("run", job["wf"], "--items", tmp_path / "x.jsonl", "--backend", "celery", "--detach", "--out", "f")
    assert detached.returncode == 2 and "--out: not with --detach" in detached.stderr
    assert not (tmp_path / "rows.jsonl").exists()
    nowhere = cli("run", job["wf"], "--items", tmp_path / "x.jsonl", "--out", tmp_path / "no" / "rows.jsonl")
    assert nowhere.returncode == 2
    missing = tmp_path / "no"
    expected = f"error: --out {missing / 'rows.jsonl'}: cannot write in {missing}: No such file or directory\n"
    assert nowhere.stderr == expected


@pytest.mark.processes
def test_results_of_a_stopped_job_write_not_run_rows_and_done_only_what_ran(backend: str, job: dict, tmp_path: Path):
    """A count threshold stops the job inside a chunk: `results` (a chunk at a time) gives every record a row, those
    that never ran `not run: ...`; `--done` only the records that ran, as the row-by-row path did."""
    items = write_records(tmp_path / "items.jsonl", 60, job["missing"], failing=tuple(range(60)))
    job["out"].parent.mkdir()
    done = cli(
        "run", job["wf"], "--items", items, "--tolerated-failure-count", 0, "--chunk-size", 7, "--output", "json",
        "--out", job["out"], *backend_args(backend),
    )  # fmt: skip
    assert done.returncode == 1 and not job["out"].exists()
    report = json.loads(done.stdout)
    every = [json.loads(line) for line in results_file(report["run_id"], tmp_path / "all.jsonl").splitlines()]
    assert [r["index"] for r in every] == list(range(60))
    not_run = [r["index"] for r in every if r["error"].startswith("not run")]
    assert not_run and len(not_run) == 60 - report["outputs"]["done"]
    ran = [json.loads(line) for line in cli("results", report["run_id"], "--done").stdout.splitlines()]
    assert [r["index"] for r in ran] == [r["index"] for r in every if r["index"] not in not_run]
    assert all(not r["error"].startswith("not run") for r in ran)


@pytest.mark.processes
def test_out_follows_a_symlink_keeps_a_files_mode_and_writes_into_a_pipe(job: dict, tmp_path: Path) -> None:
    """`--out` replaces a regular file whole, but through a symlink (the link stays, its target gets the rows, with
    its mode), and writes straight into what is no regular file (`/dev/stdout` read by a pipe)."""
    items = write_records(tmp_path / "items.jsonl", 3)
    done = cli("run", job["wf"], "--items", items, "--output", "json")
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    expected = results_file(run_id, tmp_path / "plain.jsonl")
    target, link = tmp_path / "target.jsonl", tmp_path / "link.jsonl"
    target.write_text("old\n")
    target.chmod(0o600)
    link.symlink_to(target.name)
    assert cli("results", run_id, "--out", link).returncode == 0
    assert link.is_symlink() and target.read_bytes() == expected and target.stat().st_mode & 0o777 == 0o600
    piped = subprocess.run(
        f"{sys.executable} -m scheduler.cli results {run_id} --out /dev/stdout | cat",
        shell=True, cwd=ROOT, capture_output=True, timeout=180,
    )  # fmt: skip
    assert piped.returncode == 0 and piped.stdout == expected, piped.stderr
