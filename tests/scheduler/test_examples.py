"""The examples in examples/, run through the CLI exactly as the README shows them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scheduler.cli.test_cli import ROOT, run_cli

pytestmark = pytest.mark.processes  # every test here starts real processes (commands, servers, workers)

TEXTS = ROOT / "examples" / "texts"


def test_word_counts_json() -> None:
    proc = run_cli("run", "examples/word_counts.json", "--input", "folder=examples/texts", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    store = json.loads(proc.stdout)["store"]  # the run report: run_id, status, error, outputs, store

    files = sorted(str(p.relative_to(ROOT)) for p in TEXTS.glob("*.txt"))
    assert len(files) >= 4
    assert store["list"]["result"] == files

    expected = {f: len((ROOT / f).read_text(encoding="utf-8").split()) for f in files}
    agg = store["count"]
    assert (agg["count"], agg["success_count"], agg["error_count"], agg["errors"]) == (len(files), len(files), 0, None)
    assert [r["result"]["path"] for r in agg["results"]] == files  # input order
    assert {r["result"]["path"]: r["result"]["words"] for r in agg["results"]} == expected
    assert store["total"]["result"] == sum(expected.values())


def test_make_run_command_prints_the_total() -> None:
    # `make run` runs exactly: chordflow run examples/word_counts.json --input folder=examples/texts
    proc = run_cli("run", "examples/word_counts.json", "--input", "folder=examples/texts")
    assert proc.returncode == 0, proc.stderr
    total = sum(len(p.read_text(encoding="utf-8").split()) for p in TEXTS.glob("*.txt"))
    assert "status: success" in proc.stdout
    assert f"total_words = {total}" in proc.stdout


def test_continue_errors_json() -> None:
    proc = run_cli("run", "examples/continue_errors.json", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    store = json.loads(proc.stdout)["store"]  # the run report: run_id, status, error, outputs, store
    records = json.loads(Path(ROOT / "examples" / "continue_errors.json").read_text())["nodes"][0]["params"]["records"]

    agg = store["check"]
    assert (agg["count"], agg["success_count"], agg["error_count"]) == (7, 4, 3)
    errors = agg["errors"]
    assert [e["index"] for e in errors] == [1, 3, 5]  # sorted by index though the batch runs in parallel
    assert [e["item"] for e in errors] == [records[1], records[3], records[5]]
    assert [e.get("exception_type") for e in errors] == ["ValueError", None, "ValueError"]
    assert errors[1]["error"] == "Error: name is missing"
    assert "out of range: 200" in errors[2]["error"]

    results = agg["results"]
    assert results[1] is None and results[5] is None  # raised: no result
    assert results[3] == {"result": "Error: name is missing"}  # returned an "Error:" string: namespace kept
    assert results[0] == {"result": {"name": "Ada", "age": 36}}
    assert store["summary"]["result"] == {
        "valid": 4,
        "names": ["Ada", "Alan", "Edsger", "Donald"],
        "mean_age": round((36 + 41 + 72 + 86) / 4, 2),
    }


def test_dataset_job_example_replies_to_every_review_in_file_order() -> None:
    proc = run_cli(
        "run", "examples/datasets/review_replies.json", "--items", "examples/datasets/reviews.jsonl", "--as", "review",
        "--output", "json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["outputs"] == {"total": 6, "done": 6, "failed": 0}
    rows = run_cli("results", report["run_id"], "--format", "csv")
    assert rows.returncode == 0, rows.stderr
    lines = rows.stdout.splitlines()
    assert lines[0] == "index,id,sentiment,reply,error"
    assert lines[1] == "0,1,positive,Glad to hear it: 'This is wonderful!',"
    assert [line.split(",")[2] for line in lines[1:]] == ["positive", "negative", "neutral"] * 2


def test_parallel_review_streams_every_branch_then_the_fan_in() -> None:
    proc = run_cli("run", "examples/parallel_review.json", "--input", "text=I love this, great work", "--stream")
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    done = [e["branch"] for e in events if e["type"] == "branch_complete"]
    assert sorted(done) == ["sentiment", "shout", "words"]
    merge = next(i for i, e in enumerate(events) if e["type"] == "state" and e["node"] == "merge")
    assert merge > max(i for i, e in enumerate(events) if e["type"] == "branch_complete")
    final = events[-1]
    assert final["outputs"] == {"reply": "Glad to hear it: 'I love this, great work'", "words": 5}
