"""Model calls in dataset jobs (`--items`): what the records' calls billed is in `status --json`, `status` and
`results`, equal to the loopback provider's own count, on both backends; a redrive pays for no answer twice; a key
the provider refuses stops the job at its first refusal instead of once per record."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import llm_server
from tests.support.cluster import destroyable_cluster
from tests.support.llm_server import Provider
from tests.worker.datasets.test_datasets import cli

pytestmark = pytest.mark.processes  # every test here starts real processes (commands, servers, workers)

#: The record whose check fails after its answer was paid for.
FAILING = "t7"


def write_job(tmp_path: Path, count: int) -> tuple[Path, Path]:
    """A workflow asking the model about each record, then failing the record FAILING; and `count` records."""
    wf = {
        "inputs": {"record": {"description": "one record"}},
        "nodes": [
            {"id": "ask", "type": "llm", "params": {"prompt": "${record.text}", "model": "openai/gpt-test"}},
            {"id": "check", "type": "test-fail", "params": {"value": "${record.text}", "fail_on": FAILING}},
        ],
        "edges": [{"from": "ask", "to": "check"}],
        "outputs": {"answer": {"source": "${ask.response}"}},
    }
    path, items = tmp_path / "wf.json", tmp_path / "items.jsonl"
    path.write_text(json.dumps(wf))
    items.write_text("".join(json.dumps({"text": f"t{i}"}) + "\n" for i in range(count)))
    return path, items


@pytest.fixture(params=["local", "celery"])
def job_backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """(backend, provider): a loopback provider, and for "celery" a cluster whose workers were started pointing at
    it (the suite's shared workers were started before any provider was)."""
    monkeypatch.delenv("CHORDFLOW_LLM_MODEL", raising=False)
    with llm_server.serving(Provider()) as provider:
        for name, value in llm_server.environment(provider).items():
            monkeypatch.setenv(name, value)
        if request.param == "local":
            yield request.param, provider
        else:
            with destroyable_cluster(tmp_path, 5):
                yield request.param, provider


def test_a_jobs_model_calls_are_counted_as_billed_and_a_redrive_pays_for_none_again(
    job_backend: tuple[str, Provider], tmp_path: Path
) -> None:
    backend, provider = job_backend
    wf, items = write_job(tmp_path, 20)
    done = cli("run", wf, "--items", items, "--chunk-size", 6, "--backend", backend, "--output", "json")
    assert done.returncode == 1 and "failed 1 of 20 records" in done.stderr, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    billed_input, billed_output = provider.tokens()
    assert len(provider.billed()) == 20
    status = json.loads(cli("status", run_id, "--json").stdout)
    assert status["llm"] == {
        "calls": 20, "cached_calls": 0, "input_tokens": billed_input, "output_tokens": billed_output,
    }  # fmt: skip
    assert f"llm: 20 calls, {billed_input} input tokens" in cli("status", run_id).stdout

    again = cli("redrive", run_id)
    assert again.returncode == 1, again.stderr  # FAILING fails again: after its answer, kept from the first run
    assert len(provider.billed()) == 20  # its answer was not paid for twice
    status = json.loads(cli("status", run_id, "--json").stdout)
    assert status["llm"]["calls"] == 21 and status["llm"]["cached_calls"] == 1
    assert status["llm"]["input_tokens"] == billed_input  # a reused answer bills nothing
    shown = cli("results", run_id)
    assert len(shown.stdout.splitlines()) == 20
    assert shown.stderr.strip() == (
        f"llm: 21 calls (1 answered from kept answers), {billed_input} input tokens, {billed_output} output tokens"
    )


def test_a_refused_key_stops_a_job_at_its_first_refusal(job_backend: tuple[str, Provider], tmp_path: Path) -> None:
    backend, provider = job_backend
    wf, items = write_job(tmp_path, 5000)
    provider.key = "another key"  # every request is refused with 401
    done = cli("run", wf, "--items", items, "--backend", backend, "--output", "json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert "refused the key" in report["error"], report["error"]
    assert len(provider.requests) <= 2 * 4, len(provider.requests)  # a request per pool process at most (2 x 2)
    print(f"{backend}: a refused key on 5,000 records: {len(provider.requests)} requests, then the job failed")


def test_a_jobs_budget_stops_its_model_calls(job_backend: tuple[str, Provider], tmp_path: Path) -> None:
    # 200 records of 1-word prompts answered in 2 words: 3 tokens billed each, at most 1 + 64 reserved (max_tokens).
    backend, provider = job_backend
    wf, items = write_job(tmp_path, 200)
    spec = json.loads(wf.read_text())
    spec["nodes"][0]["params"]["max_tokens"] = 64
    wf.write_text(json.dumps(spec))
    done = cli(
        "run", wf, "--items", items, "--chunk-size", 10, "--backend", backend, "--budget-tokens", 150,
        "--output", "json",
    )  # fmt: skip
    assert done.returncode == 1 and "budget exhausted" in done.stderr, done.stderr
    billed = sum(provider.tokens())
    assert 0 < billed <= 150, billed  # in flight at most: the reservations of one worker's calls
    print(f"{backend}: a budget of 150 tokens on 200 records: {billed} billed, {len(provider.billed())} requests")
    run_id = json.loads(done.stdout)["run_id"]
    assert cli("update", run_id, "--budget-tokens", 100_000).returncode == 0
    again = cli("redrive", run_id)
    assert again.returncode == 1 and "failed 1 of 200 records" in again.stderr, again.stderr  # FAILING's check
    asked = [body["messages"][-1]["content"] for body in provider.bodies]
    assert sorted(asked) == sorted(f"t{i}" for i in range(200))  # every record's answer paid for once
