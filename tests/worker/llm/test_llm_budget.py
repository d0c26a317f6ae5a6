"""A run's budget for its model calls: no call starts that could take what the run billed past the cap (one atomic
reservation of the most a call can bill, replaced by what it billed), the run fails with `budget exhausted`
keeping its outcomes, and a larger budget plus `resume` finishes it with no answer paid twice. Billed tokens are
the loopback provider's own count (tests/support/llm_server.py): a call bills 1 input token (the prompt `pN`) and
2 output tokens (`echo: pN`); with `max_tokens` 10 a call reserves 11."""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import scheduler
from ir.errors import BudgetExhausted
from scheduler import api
from scheduler.localcluster import Cluster
from tests.scheduler.cli.test_cli import run_cli
from tests.support import llm_server
from tests.support.cluster import PLUGINS
from tests.support.llm_server import Provider

#: Tokens one call reserves (1 for its prompt, at most one per two characters, and its max_tokens) and bills.
RESERVED, BILLED = 11, 3


def budgeted(tokens: int, items: int, **batch: Any) -> dict[str, Any]:
    params = {"prompt": "${item}", "model": "openai/gpt-test", "max_tokens": 10}
    node = {"id": "ask", "type": "llm", "params": params, "batch": {"items": "${items}", **batch}}
    return {"nodes": [node], "budget": {"tokens": tokens}, "inputs": {"items": {"default": prompts(items)}}}


def prompts(count: int) -> list[str]:
    return [f"p{i}" for i in range(count)]


def asked(provider: Provider) -> Counter[str]:
    """How many times each prompt was billed."""
    return Counter(body["messages"][-1]["content"] for body in provider.bodies)


def test_a_local_run_stops_at_its_budget_and_a_larger_one_finishes_it(provider: Provider, tmp_path: Path) -> None:
    with pytest.raises(BudgetExhausted, match=re.escape("budget exhausted: 30 of 40 tokens")):
        scheduler.run(budgeted(40, 20))
    assert sum(provider.tokens()) == 30 <= 40  # 10 calls: the 11th could have taken 30 + 11 past 40
    run_id = next(r.run_id for r in scheduler_runs() if r.status == "failed")
    scheduler.update(run_id, budget_tokens=1000)  # a local run that stopped takes a new budget for its resume
    resumed = scheduler.resume(run_id)
    assert resumed.status == "success" and resumed.shared["ask"]["success_count"] == 20
    assert asked(provider) == Counter(prompts(20))  # every prompt once: the first 10 answers were kept


def scheduler_runs() -> list[Any]:
    from worker.runs.sqlite import LocalRuns

    return LocalRuns.default().recent(None, 5)


@pytest.mark.processes
def test_the_cli_flags_set_the_budget(provider: Provider, tmp_path: Path) -> None:
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({**budgeted(10_000, 20), "budget": None}))
    env = {k: v for k, v in os.environ.items() if k != "CHORDFLOW_LLM_MODEL"}
    proc = run_cli("run", wf, "--budget-tokens", "25", env=env)
    assert proc.returncode == 1 and "budget exhausted: 15 of 25 tokens" in proc.stderr, proc.stderr
    assert len(provider.billed()) == 5  # the sixth could have taken 15 + 11 past 25
    bad = run_cli("run", wf, "--budget-tokens", "0", env=env)
    assert bad.returncode == 2 and "--budget-tokens" in bad.stderr


@pytest.mark.processes
def test_a_cluster_run_stops_at_its_budget_on_every_worker_and_resumes_after_an_update(tmp_path: Path) -> None:
    # 60 items in chunks of 10 on two workers, answers of 100 ms (a fast model), a budget of 100 tokens: at most
    # 100 + the reservations of the two calls in flight are billed before the run fails. `update --budget-tokens`
    # and `resume` at once finish it, every prompt billed once but for the item the other worker's chunk had in
    # flight (a chunk of the plan a resume replaces stops before its next item).
    with llm_server.serving(Provider(delay=0.1)) as provider:
        env = {**os.environ, **llm_server.environment(provider)}
        env.pop("CHORDFLOW_LLM_MODEL", None)
        cluster = Cluster(tmp_path, plugins=PLUGINS, base_env=env)
        previous = cluster.apply_env()
        try:
            for name in ("b1", "b2"):
                cluster.start_worker(name)
            with pytest.MonkeyPatch.context() as patch:
                for name, value in llm_server.environment(provider).items():
                    patch.setenv(name, value)
                wf = budgeted(100, 60, chunk_size=10)
                run_id = scheduler.submit(wf)
                failed = scheduler.wait(run_id, timeout=120)
                billed = sum(provider.tokens())
                scheduler.update(run_id, budget_tokens=1000)
                api.resume_cluster(run_id)
                done = scheduler.wait(run_id, timeout=120)
        finally:
            cluster.restore_env(previous)
            cluster.stop()
    assert failed.status == "failed" and "budget exhausted:" in failed.error and "of 100 tokens" in failed.error
    assert billed <= 100 + 2 * RESERVED, billed
    assert done.status == "success", done.error
    assert [r["response"] for r in done.shared["ask"]["results"]] == [f"echo: {p}" for p in prompts(60)]
    counts = asked(provider)
    assert set(counts) == set(prompts(60)) and max(counts.values()) <= 2, counts
    assert counts.total() <= 62, counts  # at most one item per worker in flight when the run resumed
    print(f"budget 100: {billed} tokens billed before the run failed; {sum(provider.tokens())} in all after resume")
