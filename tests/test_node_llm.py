"""The `llm` node: the deterministic fake, the `llm` package path (stubbed), usage accounting."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

import scheduler
from worker.nodes.llm import LlmNode, fake_response
from worker.store import NamespacedStore


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
        {"node": "llm", "model": "fake", "prompt_chars": 5, "response_chars": len(response)}
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


def test_missing_package_falls_back_to_the_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHORDFLOW_LLM_MODEL")
    monkeypatch.setitem(sys.modules, "llm", None)  # makes `import llm` raise ImportError
    _, out = run_llm({"prompt": "hi", "model": "gpt-4o"})
    assert out["response"] == fake_response("gpt-4o", None, "hi")
    assert out["__llm_calls__"][0]["model"] == "fake"


def test_llm_package_is_called_with_model_system_and_temperature(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHORDFLOW_LLM_MODEL")
    stub = StubLlm()
    monkeypatch.setitem(sys.modules, "llm", stub)
    _, out = run_llm({"prompt": "2+2?", "model": "stub-1", "system": "be exact", "temperature": 0.2})
    assert stub.calls == [{"model": "stub-1", "prompt": "2+2?", "system": "be exact", "temperature": 0.2}]
    assert out["response"] == "stub answer to 2+2?"
    assert out["__llm_calls__"] == [
        {"node": "llm", "model": "stub-1", "prompt_chars": 4, "response_chars": len("stub answer to 2+2?")}
    ]


def test_env_model_is_the_default_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHORDFLOW_LLM_MODEL", "env-model")
    stub = StubLlm()
    monkeypatch.setitem(sys.modules, "llm", stub)
    run_llm({"prompt": "x"})
    assert stub.calls == [{"model": "env-model", "prompt": "x", "system": None}]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "llm: param 'prompt' is required"),
        ({"prompt": 3}, "llm: param 'prompt' must be a string"),
        ({"prompt": "x", "model": 3}, "llm: param 'model' must be a string"),
        ({"prompt": "x", "system": ["a"]}, "llm: param 'system' must be a string"),
        ({"prompt": "x", "temperature": "hot"}, "llm: param 'temperature' must be a number"),
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
