"""The `llm` node against real wire protocols: the official `openai` and `anthropic` clients talk over HTTP to a
loopback provider (tests/support/llm_server.py) exactly as to OpenAI or Anthropic. A model other than `fake` is
never answered offline; an error that every item would meet (no key, a refused key, an unknown model) stops the
batch at the first, locally and on the cluster."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import scheduler
from ir.errors import SameForEveryItem, ValidationError
from scheduler.localcluster import Cluster
from tests.support import llm_server
from tests.support.cluster import PLUGINS
from tests.support.llm_server import Provider
from worker.llm import providers
from worker.llm.usage import usage_totals

ROOT = Path(__file__).parents[3]
PROVIDER_VARIABLES = ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")


def ask(model: str, **params: Any) -> dict[str, Any]:
    return {"id": "ask", "type": "llm", "params": {"prompt": "say hello in French", "model": model, **params}}


def test_an_openai_model_is_answered_by_the_server_with_its_usage(provider: Provider) -> None:
    result = scheduler.run({"nodes": [ask("openai/gpt-test", system="be brief", temperature=0.2, max_tokens=50)]})
    assert result.shared["ask"]["response"] == "echo: say hello in French"
    assert provider.billed() == [("openai", "gpt-test", 200)]
    [call] = result.shared["__llm_calls__"]
    assert (call["model"], call["input_tokens"], call["output_tokens"]) == ("gpt-test", 6, 5)  # system words too
    assert provider.tokens() == (6, 5)


def test_an_anthropic_model_is_answered_with_its_usage(provider: Provider) -> None:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "and in French?"}]  # fmt: skip
    params = {"messages": messages, "model": "anthropic/claude-test", "temperature": 0.3, "max_tokens": 100}
    node = {"id": "ask", "type": "llm", "params": params}
    result = scheduler.run({"nodes": [node]})
    assert result.shared["ask"]["response"] == "echo: and in French?"
    assert provider.billed() == [("anthropic", "claude-test", 200)]
    [body] = provider.bodies
    assert (body["temperature"], body["max_tokens"], len(body["messages"])) == (0.3, 100, 3)
    [call] = result.shared["__llm_calls__"]
    assert (call["input_tokens"], call["output_tokens"]) == provider.tokens() == (5, 4)


def test_a_bare_name_goes_to_the_provider_the_environment_names(
    provider: Provider, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler.run({"nodes": [ask("gpt-test")]})
    monkeypatch.setenv("CHORDFLOW_LLM_PROVIDER", "anthropic")
    scheduler.run({"nodes": [ask("claude-test")]})
    monkeypatch.setenv("CHORDFLOW_LLM_MODEL", "anthropic/claude-test")  # the default model of a node naming none
    scheduler.run({"nodes": [{"id": "ask", "type": "llm", "params": {"prompt": "p"}}]})
    assert provider.billed() == [("openai", "gpt-test", 200), ("anthropic", "claude-test", 200)] * 1 + [
        ("anthropic", "claude-test", 200)
    ]


def test_a_node_base_url_wins_over_the_variable(provider: Provider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
    result = scheduler.run({"nodes": [ask("openai/gpt-test", base_url=f"{provider.url}/v1")]})
    assert result.shared["ask"]["response"] == "echo: say hello in French"


def test_a_429_with_retry_after_is_waited_out_without_using_an_attempt(provider: Provider) -> None:
    provider.throttle = 2
    node = {**ask("openai/gpt-test"), "max_retries": 1}
    result = scheduler.run({"nodes": [node]})
    assert result.status == "success"
    assert [status for _, _, status in provider.requests] == [429, 429, 200]
    assert len(result.shared["__llm_calls__"]) == 1  # a throttled call never reaches post


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "scheduler.cli", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def keyless_env(provider: Provider) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (*PROVIDER_VARIABLES, "CHORDFLOW_LLM_MODEL")}
    env["OPENAI_BASE_URL"] = f"{provider.url}/v1"
    return env


@pytest.mark.processes
def test_a_missing_key_is_one_line_before_anything_runs_never_the_fake(provider: Provider, tmp_path: Path) -> None:
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({"nodes": [ask("gpt-4o-mini")]}))
    for command in (("run", str(wf)), ("validate", str(wf))):
        proc = cli(*command, env=keyless_env(provider))
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert (
            "(id 'ask')" in lines[0]
            and """model 'gpt-4o-mini' needs OPENAI_API_KEY; "model": "fake" answers""" in (lines[0])
        )
        assert "fake:" not in proc.stdout
    assert provider.requests == []


def test_submit_refuses_a_model_without_its_key(provider: Provider, celery_cluster: Cluster, tmp_path: Path) -> None:
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({"nodes": [ask("anthropic/claude-test")]}))
    env = {**celery_cluster.env, **keyless_env(provider)}
    proc = cli("submit", str(wf), env=env)
    assert proc.returncode == 2 and "model 'anthropic/claude-test' needs ANTHROPIC_API_KEY" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def batch(model: str, items: int, **options: Any) -> dict[str, Any]:
    node = {"id": "ask", "type": "llm", "params": {"prompt": "${item}", "model": model}}
    node["batch"] = {"items": "${items}", "error_handling": "continue", **options}
    return {"nodes": [node]}


@pytest.mark.parametrize(
    ("model", "key", "refusal"),
    [("openai/gpt-test", "sk-wrong", "refused the key (HTTP 401"), ("openai/gpt-nope", llm_server.KEY, "HTTP 404")],
)
def test_a_refused_key_or_unknown_model_stops_a_local_batch_at_the_first_item(
    provider: Provider, monkeypatch: pytest.MonkeyPatch, model: str, key: str, refusal: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", key)
    with pytest.raises(SameForEveryItem, match=re.escape(refusal)):  # whatever error_handling says: `continue` here
        scheduler.run(batch(model, 50, max_retries=3), {"items": [f"p{i}" for i in range(50)]})
    assert len(provider.requests) == 1


@pytest.mark.processes
def test_a_refused_key_stops_a_cluster_batch_after_one_request_per_worker(tmp_path: Path) -> None:
    # Two solo workers whose OPENAI_API_KEY the provider refuses; a `continue` batch of 5,000 items in chunks of
    # 10: each worker pays at most one refusal, and the run fails with it.
    with llm_server.serving() as provider:
        env = {**os.environ, **llm_server.environment(provider, key="sk-wrong")}
        cluster = Cluster(tmp_path, plugins=PLUGINS, base_env=env)
        previous = cluster.apply_env()
        try:
            cluster.start_worker("l1")
            cluster.start_worker("l2")
            wf = batch("openai/gpt-test", 5000, chunk_size=10)
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("OPENAI_API_KEY", "sk-the-clients-own")  # the client has a key: submit goes on
                run_id = scheduler.submit(wf, {"items": [f"p{i}" for i in range(5000)]})
            result = scheduler.wait(run_id, timeout=120)
        finally:
            cluster.restore_env(previous)
            cluster.stop()
    assert result.status == "failed"
    assert "batch node 'ask': model 'openai/gpt-test': the provider refused the key (HTTP 401" in result.error
    assert 1 <= len(provider.requests) <= 2, provider.requests


def test_a_worker_without_the_key_sends_nothing(celery_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite's workers have no OPENAI_API_KEY; this client has one, so submit goes on: the first item on a
    # worker stops the batch without a request.
    assert "OPENAI_API_KEY" not in celery_cluster.env
    with llm_server.serving() as provider:
        monkeypatch.setenv("OPENAI_API_KEY", llm_server.KEY)
        wf = batch("openai/gpt-test", 100, chunk_size=10)
        wf["nodes"][0]["params"]["base_url"] = f"{provider.url}/v1"
        run_id = scheduler.submit(wf, {"items": list(range(100))})
        with pytest.raises(ValidationError, match=re.escape("model 'openai/gpt-test' needs OPENAI_API_KEY")):
            scheduler.wait(run_id, timeout=120)  # the worker loading the workflow says so, before any item
    assert scheduler.status(run_id)["status"] == "failed"
    assert provider.requests == []


def test_the_model_name_is_split_into_provider_and_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHORDFLOW_LLM_PROVIDER", raising=False)
    assert providers.model_of("openai/gpt-4o-mini") == providers.Model("openai", "gpt-4o-mini", "openai/gpt-4o-mini")
    assert providers.model_of("anthropic/claude-x").provider == "anthropic"
    assert providers.model_of("meta-llama/llama-3") == providers.Model(
        "openai", "meta-llama/llama-3", "meta-llama/llama-3"
    )
    assert providers.model_of("openai/meta-llama/llama-3").name == "meta-llama/llama-3"  # OpenRouter-style ids
    monkeypatch.setenv("CHORDFLOW_LLM_PROVIDER", "anthropic")
    assert providers.model_of("claude-x").provider == "anthropic"


def test_calls_are_priced_from_the_users_prices(
    provider: Provider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"openai/gpt-test": {"input": 2.0, "output": 10.0}}))
    monkeypatch.setenv("CHORDFLOW_LLM_PRICES", str(prices))
    result = scheduler.run({"nodes": [ask("openai/gpt-test"), {**ask("anthropic/claude-test"), "id": "other"}]})
    priced, unpriced = result.shared["__llm_calls__"]
    assert priced["cost_usd"] == pytest.approx((4 * 2.0 + 5 * 10.0) / 1_000_000)  # the server's own token counts
    assert "cost_usd" not in unpriced  # no price: tokens only
    totals = usage_totals(result.shared)
    assert totals is not None and totals["cost_usd"] == pytest.approx(priced["cost_usd"])
    assert totals["input_tokens"] == provider.tokens()[0]


def test_a_bad_prices_file_stops_the_batch_once(provider: Provider, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHORDFLOW_LLM_PRICES", '{"openai/gpt-test": {"input": "cheap"}}')
    with pytest.raises(SameForEveryItem, match="CHORDFLOW_LLM_PRICES: model 'openai/gpt-test': expected"):
        scheduler.run(batch("openai/gpt-test", 5), {"items": list("abcde")})
    assert provider.requests == []
