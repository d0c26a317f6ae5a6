"""Dataset jobs (`--items FILE`): the workflow once per record, on both backends, from the CLI and Python.

Real parts only: the `backend` fixture runs each test locally and on the suite's cluster (real
redis-server, real workers). Side effects are counted in files, so "ran once" is a fact on disk.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import scheduler
from scheduler.localcluster import Cluster
from tests.scheduler.test_durable import VISIBILITY_TIMEOUT, until
from tests.support.cluster import destroyable_cluster
from tests.support.kinds import starts
from worker.cluster.state.runstate import RunState

ROOT = Path(__file__).parents[3]


def cli(*args: Any, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """`chordflow ARGS` as a subprocess, in this process's environment (the suite's cluster when started)."""
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def per_record_workflow(log: Path, gated: bool = False) -> dict[str, Any]:
    """Two nodes per record: a side effect logged to `log` (raising while `record.requires` names a missing
    file; `gated`: waiting while `record.gate` names a file that is not there), then an upper-casing; the declared
    outputs are the record's result."""
    work = {"log": str(log), "label": "${record.id}", "requires": "${record.requires}"}
    if gated:
        work["gate"] = "${record.gate}"
    return {
        "inputs": {"record": {"description": "one record"}},
        "nodes": [
            {
                "id": "work",
                "type": "test-side-effect",
                "params": work,
            },
            {"id": "shout", "type": "test-upper", "params": {"text": "${work.label}"}},
        ],
        "outputs": {"label": {"source": "${work.label}"}, "upper": {"source": "${shout.value}"}},
    }


def write_records(path: Path, count: int, missing: Path | None = None, failing: tuple[int, ...] = ()) -> Path:
    with path.open("w") as f:
        for i in range(count):
            needs = str(missing) if i in failing else ""
            f.write(json.dumps({"id": f"r{i}", "requires": needs}) + "\n")
    return path


def logged(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def result_rows(run_id: str, *extra: Any) -> list[dict[str, Any]]:
    done = cli("results", run_id, *extra)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def backend_args(backend: str) -> list[str]:
    return ["--backend", backend]


@pytest.fixture
def job(tmp_path: Path) -> dict[str, Path]:
    log = tmp_path / "log.txt"
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(per_record_workflow(log)))
    return {"wf": wf, "log": log, "missing": tmp_path / "flag"}


@pytest.mark.processes
def test_every_record_runs_once_and_results_stream_in_input_order(backend: str, job: dict, tmp_path: Path) -> None:
    items = write_records(tmp_path / "items.jsonl", 57)
    done = cli("run", job["wf"], "--items", items, "--chunk-size", 5, "--output", "json", *backend_args(backend))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "success" and report["outputs"] == {"total": 57, "done": 57, "failed": 0}
    assert sorted(logged(job["log"])) == sorted(f"r{i}" for i in range(57))  # each record ran exactly once
    rows = result_rows(report["run_id"])
    assert [r["index"] for r in rows] == list(range(57))
    assert rows[12] == {"index": 12, "result": {"label": "r12", "upper": "R12"}, "error": None}
    status = json.loads(cli("status", report["run_id"], "--json").stdout)
    assert status["records"]["total"] == 57 and status["records"]["done"] == 57 and status["records"]["failed"] == 0


@pytest.mark.processes
def test_failed_records_fail_the_job_saying_how_many_and_redrive_reruns_only_them(
    backend: str, job: dict, tmp_path: Path
) -> None:
    items = write_records(tmp_path / "items.jsonl", 20, job["missing"], failing=(3, 7, 15))
    done = cli("run", job["wf"], "--items", items, "--chunk-size", 4, "--output", "json", *backend_args(backend))
    assert done.returncode == 1, done.stderr
    assert "failed 3 of 20 records (15.0%)" in done.stderr
    assert " -> failed" not in done.stderr  # no worker log line in the client
    run_id = json.loads(done.stdout)["run_id"]
    assert len(logged(job["log"])) == 17  # the three failing ones raise before logging
    errors = result_rows(run_id, "--errors")
    assert [r["index"] for r in errors] == [3, 7, 15] and "missing" in errors[0]["error"]
    shown = cli("status", run_id).stdout  # its records say where it stands, not `steps: 0  node: -`
    assert "records: 20/20 done, 3 failed" in shown and "steps:" not in shown and "(reading)" not in shown
    refused = cli("resume", run_id)  # a job goes on with redrive: resume would turn it failed, running nothing
    assert refused.returncode == 2
    assert refused.stderr == (
        f"error: run {run_id} is a dataset job (--items): `chordflow redrive {run_id}` runs its failed and "
        "unfinished records again\n"
    )

    job["missing"].write_text("now it exists")
    again = cli("redrive", run_id)
    assert again.returncode == 0, again.stderr
    assert sorted(logged(job["log"])) == sorted(f"r{i}" for i in range(20))  # only the three ran again
    rows = result_rows(run_id)
    assert [r["error"] for r in rows] == [None] * 20
    assert rows[7]["result"] == {"label": "r7", "upper": "R7"}
    assert json.loads(cli("status", run_id, "--json").stdout)["status"] == "succeeded"


@pytest.mark.processes
def test_a_job_whose_every_record_failed_names_the_most_common_error(backend: str, tmp_path: Path) -> None:
    wf = tmp_path / "wf.json"
    node = {"id": "say", "type": "test-upper", "params": {"text": "${record.txt}"}}  # the records have no `txt`
    wf.write_text(json.dumps({"inputs": {"record": {}}, "nodes": [node]}))
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(30)))
    done = cli("run", wf, "--items", items, "--chunk-size", 8, "--output", "json", *backend_args(backend))
    assert done.returncode == 1, done.stderr
    error = json.loads(done.stdout)["error"]
    assert error.startswith("failed 30 of 30 records (100.0%); most common error: 30 x TemplateError: "), error
    assert "${record.txt}" in error
    status = json.loads(cli("status", json.loads(done.stdout)["run_id"], "--json").stdout)
    assert status["error"] == error


def test_progress_is_an_event_per_failed_record_and_one_per_chunk_for_the_others(
    backend: str, job: dict, tmp_path: Path
) -> None:
    # The last record waits for a gate the follower opens once it saw both failures: the job cannot end (and
    # drop its per-record progress from Redis) before `wait` read them, however slow the follower starts.
    gate = tmp_path / "gate"
    wf = per_record_workflow(job["log"], gated=True)
    (tmp_path / "gated.json").write_text(json.dumps(wf))
    items = write_records(tmp_path / "items.jsonl", 60, job["missing"], failing=(6, 47))
    records = [json.loads(line) for line in items.read_text().splitlines()]
    rows = (json.dumps({**r, "gate": str(gate) if i == 59 else ""}) + "\n" for i, r in enumerate(records))
    items.write_text("".join(rows))
    seen: list[dict[str, Any]] = []

    def follow(event: dict[str, Any]) -> None:
        seen.append(event)
        failures = {e["index"] for e in seen if e["type"] == "batch_progress" and not e["ok"]}
        if failures >= {6, 47}:
            gate.touch()

    result = scheduler.run(
        tmp_path / "gated.json", items=items, chunk_size=10, tolerated_failure_count=2, backend=backend, on_event=follow
    )
    assert result.status == "success" and result.outputs == {"total": 60, "done": 60, "failed": 2}
    progress = [e for e in seen if e["type"] == "batch_progress"]
    assert sorted(e["index"] for e in progress if not e["ok"]) == [6, 47]  # each failed record, by its index
    assert {e["node"] for e in progress} == {"records"}
    # not an event per record: at most one per chunk (a worker's chunk flushes what it has every 0.25 s)
    assert 5 <= sum(e["ok"] for e in progress) <= 30


@pytest.mark.processes
def test_tolerated_failures_let_the_job_succeed_and_an_exceeded_threshold_fails_it(
    backend: str, job: dict, tmp_path: Path
) -> None:
    items = write_records(tmp_path / "items.jsonl", 40, job["missing"], failing=(1, 22))
    within = cli("run", job["wf"], "--items", items, "--tolerated-failure-percent", 5, *backend_args(backend))
    assert within.returncode == 0, within.stderr
    over = cli("run", job["wf"], "--items", items, "--tolerated-failure-percent", 2, *backend_args(backend))
    assert over.returncode == 1
    assert "failed 2 of 40 records (5.0%), tolerated 2%" in over.stderr
    by_count = cli("run", job["wf"], "--items", items, "--tolerated-failure-count", 1, *backend_args(backend))
    assert by_count.returncode == 1 and "tolerated 1" in by_count.stderr


@pytest.mark.processes
def test_a_count_threshold_stops_the_job_before_every_record_ran(backend: str, job: dict, tmp_path: Path) -> None:
    items = write_records(tmp_path / "items.jsonl", 400, job["missing"], failing=tuple(range(400)))
    done = cli(
        "run", job["wf"], "--items", items, "--tolerated-failure-count", 0, "--chunk-size", 5, "--output", "json",
        *backend_args(backend),
    )  # fmt: skip
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert "tolerated 0" in report["error"] and "not run" in report["error"]
    assert report["outputs"]["done"] < 400  # it stopped dispatching
    rows = result_rows(report["run_id"])
    assert len(rows) == 400 and any(r["error"].startswith("not run") for r in rows)


@pytest.mark.processes
def test_a_malformed_record_is_one_line_naming_file_and_line_or_a_failed_record(
    backend: str, job: dict, tmp_path: Path
) -> None:
    items = write_records(tmp_path / "items.jsonl", 80)
    text = items.read_text().splitlines()
    text[56] = '{"id": "r56", oops'
    items.write_text("\n".join(text) + "\n")
    bad = cli("run", job["wf"], "--items", items, *backend_args(backend))
    assert bad.returncode == 2
    assert "items.jsonl line 57" in bad.stderr and "Traceback" not in bad.stderr
    skipped = cli("run", job["wf"], "--items", items, "--skip-bad-records", "--output", "json", *backend_args(backend))
    assert skipped.returncode == 1
    report = json.loads(skipped.stdout)
    assert "failed 1 of 80 records" in report["error"]
    (row,) = result_rows(report["run_id"], "--errors")
    assert row["index"] == 56 and "line 57" in row["error"]


def write_with_long_record(path: Path, count: int, at: int, size: int) -> Path:
    """`count` records, the one at index `at` padded to `size` bytes on its line (written a MiB at a time)."""
    with path.open("w") as f:
        for i in range(count):
            line = json.dumps({"id": f"r{i}", "requires": "", "pad": ""})
            if i != at:
                f.write(line + "\n")
                continue
            f.write(line[:-2])  # up to the opening quote of the pad
            left = size - len(line)
            while left:
                left -= f.write("x" * min(left, 1 << 20))
            f.write('"}\n')
    return path


@pytest.mark.processes
def test_a_record_over_the_cap_is_one_line_naming_file_and_line_or_a_failed_record(
    backend: str, job: dict, tmp_path: Path
) -> None:
    items = write_with_long_record(tmp_path / "items.jsonl", 6, 2, 20 * 1024 * 1024)
    over = cli("run", job["wf"], "--items", items, "--output", "json", *backend_args(backend))
    assert over.returncode == 2
    line = f"{items} line 3: record is 20971520 bytes, over --max-record-bytes 16777216"
    assert over.stderr == f"error: {line}\n" and json.loads(over.stdout)["error"] == line
    assert logged(job["log"]) == []  # nothing ran: the window holding the record was never complete

    items = write_with_long_record(tmp_path / "small.jsonl", 6, 4, 1500)
    skipped = cli(
        "run", job["wf"], "--items", items, "--max-record-bytes", 1000, "--skip-bad-records", "--output", "json",
        *backend_args(backend),
    )  # fmt: skip
    assert skipped.returncode == 1, skipped.stderr
    report = json.loads(skipped.stdout)
    assert report["error"] == "failed 1 of 6 records (16.7%)" and report["outputs"]["done"] == 6
    (row,) = result_rows(report["run_id"], "--errors")
    assert row["index"] == 4 and row["error"].endswith("line 5: record is 1500 bytes, over --max-record-bytes 1000")
    assert sorted(logged(job["log"])) == ["r0", "r1", "r2", "r3", "r5"]
    bad = cli("run", job["wf"], "--items", items, "--max-record-bytes", 0, *backend_args(backend))
    assert bad.returncode == 2 and bad.stderr == "error: --max-record-bytes: must be 1 or more, got 0\n"
    assert (
        cli("run", job["wf"], "--max-record-bytes", 5).stderr
        == "error: --max-record-bytes needs --items FILE (a dataset job)\n"
    )


@pytest.mark.processes
def test_a_records_file_that_cannot_be_read_is_a_usage_error_that_records_no_run(job: dict, tmp_path: Path) -> None:
    from worker.runs.sqlite import LocalRuns

    before = [r.run_id for r in LocalRuns.default().recent()]
    for items, error in ((tmp_path / "none.jsonl", "file not found"), (tmp_path, "is a directory, not a file")):
        done = cli("run", job["wf"], "--items", items)
        assert done.returncode == 2
        assert done.stderr.strip() == f"error: {items}: {error}"
    assert [r.run_id for r in LocalRuns.default().recent()] == before


@pytest.mark.processes
def test_csv_records_with_fields_as_inputs_and_csv_results(backend: str, tmp_path: Path) -> None:
    wf = tmp_path / "wf.json"
    wf.write_text(
        json.dumps(
            {
                "inputs": {"name": {}, "city": {}},
                "nodes": [{"id": "up", "type": "test-upper", "params": {"text": "${name} of ${city}"}}],
                "outputs": {"title": {"source": "${up.value}"}, "city": {"source": "${city}"}},
            }
        )
    )
    items = tmp_path / "people.csv"
    items.write_text('name,city\nada,london\n"bob, jr",paris\n')
    done = cli("run", wf, "--items", items, "--as", "-", "--output", "json", *backend_args(backend))
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    table = list(csv.reader(io.StringIO(cli("results", run_id, "--format", "csv").stdout)))
    assert table == [["index", "title", "city", "error"], ["0", "ADA OF LONDON", "london", ""],
                     ["1", "BOB, JR OF PARIS", "paris", ""]]  # fmt: skip


def test_python_api_submits_an_iterable_of_records(broker: Any, job: dict) -> None:
    records = ({"id": f"p{i}", "requires": ""} for i in range(30))
    run_id = scheduler.submit(job["wf"], items=records, as_="record", chunk_size=7)
    result = scheduler.wait(run_id, timeout=120)
    assert result.status == "success" and result.outputs == {"total": 30, "done": 30, "failed": 0}
    assert scheduler.status(run_id)["records"]["done"] == 30


def test_results_done_shows_what_finished_while_the_job_runs(celery_cluster: Any, tmp_path: Path) -> None:
    log, gate = tmp_path / "log.txt", tmp_path / "gate"
    wf = tmp_path / "wf.json"
    wf.write_text(
        json.dumps(
            {
                "inputs": {"record": {}},
                "nodes": [
                    {
                        "id": "work",
                        "type": "test-side-effect",
                        "params": {"log": str(log), "label": "${record.id}", "gate": "${record.gate}"},
                    }
                ],
                "outputs": {"label": {"source": "${work.label}"}},
            }
        )
    )
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": i, "gate": str(gate) if i == 12 else ""}) + "\n" for i in range(20)))
    submitted = cli("submit", wf, "--items", items, "--chunk-size", 5)
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.split()[0]
    until(lambda: len(logged(log)) >= 15, 60, "every record but the gated chunk's last ones to run")
    partial = [r["index"] for r in result_rows(run_id, "--done")]
    assert partial[:5] == [0, 1, 2, 3, 4] and 12 not in partial and partial == sorted(partial)
    assert json.loads(cli("status", run_id, "--json").stdout)["status"] == "running"
    gate.write_text("open")
    waited = cli("wait", run_id)
    assert waited.returncode == 0, waited.stderr
    assert [r["index"] for r in result_rows(run_id)] == list(range(20))


# -- processes die -----------------------------------------------------------------------------------------


@pytest.fixture
@starts("faults")
def own_cluster(tmp_path: Path) -> Iterator[Cluster]:
    (tmp_path / "cluster").mkdir()
    with destroyable_cluster(tmp_path / "cluster", VISIBILITY_TIMEOUT) as cluster:
        yield cluster


def test_a_sigkilled_worker_mid_chunk_loses_and_duplicates_no_record(own_cluster: Cluster, tmp_path: Path) -> None:
    log = tmp_path / "log.txt"
    wf = per_record_workflow(log)
    wf["nodes"][0]["params"]["seconds"] = 0.02
    records = ({"id": f"r{i}", "requires": ""} for i in range(300))
    run_id = scheduler.submit(wf, items=records, chunk_size=10)
    until(lambda: len(logged(log)) >= 60, 60, "records to run")
    own_cluster.workers["k1"].kill(signal.SIGKILL)  # mid-chunk: its chunk is unacknowledged and comes back
    result = scheduler.wait(run_id, timeout=VISIBILITY_TIMEOUT + 120)
    assert result.status == "success" and result.outputs == {"total": 300, "done": 300, "failed": 0}
    rows = [json.loads(line) for line in cli("results", run_id).stdout.splitlines()]
    assert [r["result"]["label"] for r in rows] == [f"r{i}" for i in range(300)]  # one outcome per record, in order
    assert set(logged(log)) == {f"r{i}" for i in range(300)}  # at least once each (the killed chunk's ran twice)


def test_a_job_whose_submitting_client_is_killed_mid_file_ends_failed_saying_so(
    own_cluster: Cluster, job: dict, tmp_path: Path
) -> None:
    items = write_records(tmp_path / "items.jsonl", 400_000)
    client = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "submit", job["wf"], "--items", items, "--chunk-size", "1000"],
        cwd=ROOT, env={**os.environ, "CHORDFLOW_WORKER_HEARTBEAT": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    redis_client = RunState("x").redis

    def reading() -> str | None:
        for name in redis_client.scan_iter(match="cf:{*}:ds", count=1000):
            if redis_client.hget(name, "read") and not redis_client.hexists(name, "total"):
                return name.decode().split("{")[1].split("}")[0]
        return None

    run_id = until(reading, 60, "the client to store its first chunks")
    client.kill()  # SIGKILL, mid-file: the job will never learn its total
    client.wait()
    result = scheduler.wait(run_id, timeout=120)
    assert result.status == "failed"
    assert f"the client reading {items} stopped after" in result.error and "submit the job again" in result.error
    assert json.loads(cli("status", run_id, "--json").stdout)["records"]["total"] is None
    # It cannot be redriven (its file was never read to the end): the records it stored are gone with it.
    assert not redis_client.exists(f"cf:{{{run_id}}}:ds:rec") and redis_client.exists(f"cf:{{{run_id}}}:ds:out")


@pytest.mark.parametrize("following", [True, False])
def test_a_cluster_chunk_publishes_each_record_once_whether_it_follows_the_loop_or_is_told(
    celery_cluster: Any, following: bool
) -> None:
    # In-process on the suite's redis-server: a chunk's hooks read its records' outcomes off the loop's ChunkResult
    # (the usual chunk) or are told of each (records appending to the store's lists); the run's stream gets one
    # (index, ok) pair per record either way, a failed one not ok, written at the end at the latest.
    from worker.batch.aggregate import ChunkResult
    from worker.batch.outcome import ItemOutcome
    from worker.cluster.datasets.progress import RecordHooks

    state = RunState(f"hooks-{uuid.uuid4().hex[:8]}")
    hooks = RecordHooks(state, "records")
    chunk = ChunkResult(40, [], [], {})
    if following:  # else the loop offers it nothing to follow
        assert hooks.follow(chunk)
    for index in range(40, 50):
        assert hooks.before_item(index)
        outcome = ItemOutcome(index, None, "boom") if index in (42, 47) else ItemOutcome(index, {"n": index})
        if outcome.error is not None:
            chunk.failures.append(outcome)
        chunk.results.append(outcome.result)
        if outcome.error is not None or not following:
            hooks.after_item(outcome)
    hooks.close()
    _, entries = state.read_progress("0", 0)
    pairs = [pair for batch, packed in entries if packed for pair in RunState.unpack_outcomes(packed)]
    assert {batch for batch, _ in entries} == {"records"}
    assert [tuple(pair) for pair in pairs] == [(i, i not in (42, 47)) for i in range(40, 50)]


def test_the_default_chunk_size_spreads_a_small_file_over_32_chunks_and_cuts_a_large_one_in_2000s(
    tmp_path: Path,
) -> None:
    from scheduler.datasets.running import expected_records
    from worker.datasets.job import default_chunk_size

    def size_for(count: int) -> int:
        path = write_records(tmp_path / f"{count}.jsonl", count)
        estimate = expected_records(path)
        assert estimate is not None and abs(estimate - count) <= count * 0.05, estimate
        return default_chunk_size(estimate)

    assert size_for(100) == 500  # never under 500 records a chunk
    assert 950 <= size_for(32_000) <= 1050  # a 32nd of the file (as estimated from its first lines)
    assert size_for(100_000) == 2000
    assert default_chunk_size(expected_records(iter([{"id": 1}]))) == 500  # an iterator: cannot tell
    pipe = tmp_path / "records.jsonl"
    os.mkfifo(pipe)
    assert expected_records(pipe) is None  # never opened: a sample read would take records from the reader
    assert default_chunk_size(expected_records([{"id": i} for i in range(96_000)])) == 2000
