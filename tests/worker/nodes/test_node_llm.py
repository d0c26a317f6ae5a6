"""The `llm` node: the deterministic fake, the `llm/<model id>` provider (the optional `llm` package, stubbed here:
it is not installed), usage and token accounting, rate-limit errors waited out by the real engine. The OpenAI and
Anthropic providers over their real wire protocols: tests/worker/llm/test_llm_providers.py."""

from __future__ import annotations

import json
import subprocess
import sys
import types
import uuid
from pathlib import Path
from typing import Any

import pytest

import scheduler
from ir.errors import SameForEveryItem, Throttled, ThrottledTooLong
from worker.engine import rate_limits
from worker.llm.fake import response as fake_response
from worker.llm.usage import usage_totals
from worker.nodes.llm import LlmNode
from worker.store import NamespacedStore

ROOT = Path(__file__).parents[3]


@pytest.fixture(autouse=True)
def fake_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHORDFLOW_LLM_MODEL", "fake")


class StubLlm(types.ModuleType):
    """Stands in for the `llm` package and records what the node asked it."""

    def __init__(self) -> None:
        super().__init__("llm")
        self.calls: list[dict[str, Any]] = []

    def get_model(self, name: str | None = None) -> Any:
        stub = self

        class Model:
            model_id = name or "default-model"

            def prompt(self, prompt: str, system: str | None = None, **options: Any) -> Any:
                stub.calls.append({"model": self.model_id, "prompt": prompt, "system": system, **options})
                return types.SimpleNamespace(text=lambda: f"stub answer to {prompt}")

        return Model()


def run_llm(params: dict[str, Any], store: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    node = LlmNode()
    node.params = params
    store = {} if store is None else store
    return node._run(store), store


def test_fake_is_deterministic_and_shows_the_prompt() -> None:
    prompt = "Summarize the following text in one sentence please: lorem ipsum"
    _, first = run_llm({"prompt": prompt})
    _, second = run_llm({"prompt": prompt})
    assert first["response"] == second["response"]
    assert first["response"].startswith("fake:")
    assert first["response"].endswith(": " + prompt[:40])


def test_fake_digest_depends_on_model_system_and_prompt() -> None:
    base = fake_response(None, None, "p")
    assert fake_response(None, "be terse", "p") != base
    assert fake_response("gpt-x", None, "p") != base
    assert fake_response(None, None, "q") != base
    assert fake_response(None, None, "p") == base


def test_usage_is_recorded_at_the_root() -> None:
    root: dict[str, Any] = {}
    node = LlmNode()
    node.params = {"prompt": "hello"}
    assert node._run(NamespacedStore(root, "ask")) == "default"
    response = root["ask"]["response"]
    assert root["__llm_calls__"] == [
        {
            "node": "llm",
            "model": "fake",
            "prompt_chars": 5,
            "response_chars": len(response),
            "input_tokens": 1,  # the fake counts words: "hello"
            "output_tokens": len(response.split()),
            "cached": False,
        }
    ]
    assert "__llm_calls__" not in root["ask"]


def test_usage_appends_to_an_existing_list_in_place() -> None:
    calls: list[dict[str, Any]] = [{"node": "earlier"}]
    run_llm({"prompt": "one"}, {"__llm_calls__": calls})
    _, store = run_llm({"prompt": "two"}, {"__llm_calls__": calls})
    assert store["__llm_calls__"] is calls
    assert [c["node"] for c in calls] == ["earlier", "llm", "llm"]
    assert [c["prompt_chars"] for c in calls[1:]] == [3, 3]


def test_model_fake_wins_over_an_installed_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHORDFLOW_LLM_MODEL")
    stub = StubLlm()
    monkeypatch.setitem(sys.modules, "llm", stub)
    _, out = run_llm({"prompt": "hi", "model": "fake"})
    assert out["response"].startswith("fake:")
    assert stub.calls == []


def test_env_fake_wins_over_a_named_model(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = StubLlm()
    monkeypatch.setitem(sys.modules, "llm", stub)
    _, out = run_llm({"prompt": "hi", "model": "gpt-4o"})
    assert out["response"] == fake_response("gpt-4o", None, "hi")
    assert stub.calls == []


def test_no_model_but_fake_is_ever_answered_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHORDFLOW_LLM_MODEL")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(SameForEveryItem, match="model 'gpt-4o' needs OPENAI_API_KEY"):
        run_llm({"prompt": "hi", "model": "gpt-4o"})
    with pytest.raises(SameForEveryItem, match="no model"):
        run_llm({"prompt": "hi"})


def test_the_llm_package_answers_llm_models_with_system_and_temperature(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHORDFLOW_LLM_MODEL")
    stub = StubLlm()
    monkeypatch.setitem(sys.modules, "llm", stub)
    _, out = run_llm({"prompt": "2+2?", "model": "llm/stub-1", "system": "be exact", "temperature": 0.2})
    assert stub.calls == [{"model": "stub-1", "prompt": "2+2?", "system": "be exact", "temperature": 0.2}]
    assert out["response"] == "stub answer to 2+2?"
    assert out["__llm_calls__"] == [
        {
            "node": "llm",
            "model": "stub-1",
            "prompt_chars": 4,
            "response_chars": len("stub answer to 2+2?"),
            "cached": False,
        }
    ]


def test_an_llm_model_without_the_package_stops_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHORDFLOW_LLM_MODEL")
    monkeypatch.setitem(sys.modules, "llm", None)  # makes `import llm` raise ImportError
    with pytest.raises(SameForEveryItem, match=r"model 'llm/x' needs the `llm` package"):
        run_llm({"prompt": "hi", "model": "llm/x"})


def test_env_model_is_the_default_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHORDFLOW_LLM_MODEL", "llm/env-model")
    stub = StubLlm()
    monkeypatch.setitem(sys.modules, "llm", stub)
    run_llm({"prompt": "x"})
    assert stub.calls == [{"model": "env-model", "prompt": "x", "system": None}]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "llm: param 'prompt' or 'messages' is required"),
        ({"prompt": "x", "messages": "hi"}, "llm: param 'messages' must be a list"),
        ({"prompt": "x", "max_tokens": 0}, "llm: param 'max_tokens' must be a whole number > 0"),
        ({"prompt": "x", "timeout": -1}, "llm: param 'timeout' must be a positive number"),
        ({"prompt": 3}, "llm: param 'prompt' must be a string"),
        ({"prompt": "x", "model": 3}, "llm: param 'model' must be a string"),
        ({"prompt": "x", "system": ["a"]}, "llm: param 'system' must be a string"),
        ({"prompt": "x", "temperature": "hot"}, "llm: param 'temperature' must be a number"),
        ({"prompt": "x", "max_throttle_wait": 0}, "llm: param 'max_throttle_wait' must be a positive number"),
        ({"prompt": "x", "max_throttle_wait": "1"}, "llm: param 'max_throttle_wait' must be a positive number"),
        ({"prompt": "x", "model": "fake-throttled:two"}, "llm: model 'fake-throttled:two' must be"),
    ],
)
def test_bad_params_raise_value_error(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        run_llm(params)


def test_end_to_end_chained_prompts_accumulate_usage() -> None:
    workflow = {
        "nodes": [
            {"id": "draft", "type": "llm", "params": {"prompt": "Write about ${topic}", "system": "be brief"}},
            {"id": "review", "type": "llm", "params": {"prompt": "Review: ${draft.response}"}},
        ]
    }
    result = scheduler.run(workflow, {"topic": "otters"})
    draft = result.shared["draft"]["response"]
    assert draft == fake_response("fake", "be brief", "Write about otters")
    assert result.shared["review"]["response"].endswith(": " + f"Review: {draft}"[:40])
    assert [c["prompt_chars"] for c in result.shared["__llm_calls__"]] == [18, len(f"Review: {draft}")]


def test_end_to_end_batch_usage_reaches_the_accumulator_in_item_order(backend: str) -> None:
    workflow = {
        "nodes": [
            {
                "id": "each",
                "type": "llm",
                # The model is named in the IR: a worker process does not see this test's monkeypatched env.
                "params": {"prompt": "${item}", "model": "fake"},
                "batch": {"items": "${prompts}", "parallel": True},
            }
        ]
    }
    prompts = ["a", "bb", "ccc", "dddd"]
    result = scheduler.run(workflow, {"prompts": prompts}, shared={"__llm_calls__": []}, backend=backend)
    assert [r["response"] for r in result.shared["each"]["results"]] == [
        fake_response("fake", None, p) for p in prompts
    ]
    assert [c["prompt_chars"] for c in result.shared["__llm_calls__"]] == [1, 2, 3, 4]


# -- tokens and backpressure --------------------------------------------------------------------------------


class RateLimitError(Exception):
    """Named like the providers' own (openai, anthropic): the class name is what the node recognizes."""

    def __init__(self, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.headers = headers or {}


class StatusError(Exception):
    """A provider error with an HTTP status and the response it came with."""

    def __init__(self, status_code: int, retry_after: str | None = None):
        super().__init__(f"status {status_code}")
        self.status_code = status_code
        self.response = types.SimpleNamespace(headers={"retry-after": retry_after} if retry_after else {})


class UsageLlm(StubLlm):
    """A stub `llm` package whose responses report usage like llm's Response.usage(), and whose model
    raises `errors` (one per call, in order) before it answers."""

    def __init__(self, errors: list[Exception] | None = None) -> None:
        super().__init__()
        self.errors = list(errors or [])

    def get_model(self, name: str | None = None) -> Any:
        stub = self

        class Model:
            model_id = name or "default-model"

            def prompt(self, prompt: str, system: str | None = None, **options: Any) -> Any:
                stub.calls.append({"model": self.model_id, "prompt": prompt})
                if stub.errors:
                    raise stub.errors.pop(0)
                usage = types.SimpleNamespace(input=11, output=7, details=None)
                return types.SimpleNamespace(text=lambda: "counted", usage=lambda: usage)

        return Model()


def test_fake_reports_words_as_tokens() -> None:
    _, out = run_llm({"prompt": "three little words", "system": "be brief"})
    [call] = out["__llm_calls__"]
    assert call["input_tokens"] == 5
    assert call["output_tokens"] == len(out["response"].split())


def test_reported_usage_is_recorded_and_charged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHORDFLOW_LLM_MODEL")
    monkeypatch.setitem(sys.modules, "llm", UsageLlm())
    node = LlmNode()
    node.params = {"prompt": "hi", "model": "llm/m"}
    store: dict[str, Any] = {}
    exec_res = node.exec(node.prep(store))
    assert node.tokens_used(exec_res) == 18
    node.post(store, node.prep(store), exec_res)
    assert store["__llm_calls__"][0] == {
        "node": "llm", "model": "m", "prompt_chars": 2, "response_chars": 7, "input_tokens": 11, "output_tokens": 7,
        "cached": False,
    }  # fmt: skip


def test_tokens_reach_the_rate_limit_bucket() -> None:
    """A `tokens_per_minute` bucket is charged what each call reports (the engine calls `tokens_used`)."""
    limiter = rate_limits.LocalLimiter()
    previous = rate_limits.current()
    rate_limits.use(limiter)
    try:
        limit = {"key": "llm-tokens-test", "tokens_per_minute": 6000}
        wf = {"nodes": [{"id": "ask", "type": "llm", "params": {"prompt": "a b c d"}, "rate_limit": limit}]}
        started = limiter.clock()
        result = scheduler.run(wf)
    finally:
        rate_limits.use(previous)
    [call] = result.shared["__llm_calls__"]
    owed = limiter.buckets["llm-tokens-test"]["tok"] - started
    tokens = call["input_tokens"] + call["output_tokens"]
    assert tokens * 60 / 6000 <= owed < tokens * 60 / 6000 + 5  # charged its tokens (from the bucket's start)


def test_rate_limit_error_is_waited_out_without_using_an_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHORDFLOW_LLM_MODEL")
    stub = UsageLlm([RateLimitError("slow down", {"retry-after": "0"}), StatusError(429, "0.05")])
    monkeypatch.setitem(sys.modules, "llm", stub)
    wf = {"nodes": [{"id": "ask", "type": "llm", "max_retries": 1, "params": {"prompt": "p", "model": "llm/m"}}]}
    result = scheduler.run(wf)
    assert result.status == "success"
    assert result.shared["ask"]["response"] == "counted"
    assert len(stub.calls) == 3
    assert len(result.shared["__llm_calls__"]) == 1  # a throttled call never reaches post


def test_rate_limit_errors_become_throttled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHORDFLOW_LLM_MODEL")
    errors = [RateLimitError("slow", {"Retry-After": "2"}), StatusError(429, "3"), StatusError(429), StatusError(500)]
    monkeypatch.setitem(sys.modules, "llm", UsageLlm(errors))
    node = LlmNode()
    node.params = {"prompt": "p", "model": "llm/m", "max_throttle_wait": 9}
    prep_res = node.prep({})
    seen = []
    for _ in range(3):
        with pytest.raises(Throttled) as caught:
            node.exec(prep_res)
        seen.append((caught.value.retry_after, caught.value.max_wait))
    assert seen == [(2.0, 9.0), (3.0, 9.0), (None, 9.0)]
    with pytest.raises(StatusError):  # any other error stays itself: the node's retries apply
        node.exec(prep_res)


def test_fake_throttled_ends_in_success() -> None:
    prompt = f"throttled twice {uuid.uuid4().hex}"  # the fake counts per process and prompt
    wf = {
        "nodes": [
            {"id": "ask", "type": "llm", "max_retries": 1, "params": {"prompt": prompt, "model": "fake-throttled:2"}}
        ]
    }
    result = scheduler.run(wf)
    assert result.status == "success"
    assert result.shared["ask"]["response"] == fake_response("fake-throttled:2", None, prompt)
    assert len(result.shared["__llm_calls__"]) == 1


def test_fake_throttled_past_max_throttle_wait_fails() -> None:
    params = {"prompt": f"always {uuid.uuid4().hex}", "model": "fake-throttled:9", "max_throttle_wait": 0.08}
    with pytest.raises(ThrottledTooLong, match="rate limited"):
        scheduler.run({"nodes": [{"id": "ask", "type": "llm", "params": params}]})


def test_usage_totals_count_every_entry() -> None:
    calls = [{"input_tokens": 3, "output_tokens": 4}, {"node": "other"}, {"input_tokens": 5}, "odd", {"cached": True}]
    totals = {"calls": 5, "cached_calls": 1, "input_tokens": 8, "output_tokens": 4}
    assert usage_totals({"__llm_calls__": calls}) == totals
    assert usage_totals({}) is None


@pytest.mark.processes
def test_status_and_results_show_the_token_totals() -> None:
    wf = {
        "nodes": [
            {"id": "one", "type": "llm", "params": {"prompt": "one two three", "system": "be brief", "model": "fake"}},
            {"id": "two", "type": "llm", "params": {"prompt": "four", "model": "fake"}},
        ],
        "outputs": {"answer": {"source": "${two.response}"}},
    }
    result = scheduler.run(wf)
    totals = usage_totals(result.shared)
    assert totals is not None and totals["calls"] == 2 and totals["input_tokens"] == 6
    line = f"llm: 2 calls, 6 input tokens, {totals['output_tokens']} output tokens"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "scheduler.cli", *args]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)

    assert json.loads(cli("status", result.run_id, "--json").stdout)["llm"] == totals
    assert f"  {line}" in cli("status", result.run_id).stdout.splitlines()
    shown = cli("results", result.run_id)
    assert json.loads(shown.stdout) == {"answer": result.shared["two"]["response"]}  # stdout: the outputs only
    assert shown.stderr.strip() == line


def test_a_run_with_llm_nodes_starts_its_calls_list_so_batches_record_every_call(backend: str) -> None:
    workflow = {"nodes": [{"id": "each", "type": "llm", "params": {"prompt": "${item}", "model": "fake"},
                           "batch": {"items": "${prompts}"}}]}  # fmt: skip
    result = scheduler.run(workflow, {"prompts": ["a", "bb", "ccc"]}, backend=backend)  # no __llm_calls__ given
    assert [c["prompt_chars"] for c in result.shared["__llm_calls__"]] == [1, 2, 3]
    assert usage_totals(result.shared)["calls"] == 3
