"""Provider batches on a local run, against the loopback provider's batch APIs (tests/support/llm_batches.py) through
the official clients: the items' requests answered in one provider batch at the batch price, results in input
order, a line the provider refuses the item's error, what the provider has not answered by the deadline cancelled
and asked synchronously (nothing asked twice), and where `provider_batch` may not go."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

import scheduler
from ir.errors import BudgetExhausted, ValidationError
from tests.support.llm_server import Provider
from worker.llm.usage import usage_totals

PRICES = {"openai/gpt-test": {"input": 2.0, "output": 8.0}, "anthropic/claude-test": {"input": 3.0, "output": 15.0}}


def batched(model: str, items: int, deadline: Any = "1h", **batch: Any) -> dict[str, Any]:
    params = {"prompt": "${item}", "model": model}
    spec = {"items": "${items}", "provider_batch": {"deadline": deadline}, **batch}
    node = {"id": "ask", "type": "llm", "params": params, "batch": spec}
    return {"nodes": [node], "inputs": {"items": {"default": prompts(items)}}}


def prompts(count: int) -> list[str]:
    return [f"ticket {i} says hello" for i in range(count)]


def synced(provider: Provider) -> Counter[str]:
    """How many times each prompt was asked synchronously."""
    return Counter(b["messages"][-1]["content"] for b in provider.bodies if "messages" in b and "model" in b)


def answered(provider: Provider) -> Counter[str]:
    """How many times each batch line was answered, by its custom_id."""
    return Counter(custom_id for _, _, custom_id, _ in provider.batch_answered)


@pytest.mark.parametrize("model", ["openai/gpt-test", "anthropic/claude-test"])
def test_the_items_are_answered_in_one_provider_batch_at_half_the_price(
    provider: Provider, monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    monkeypatch.setenv("CHORDFLOW_LLM_PRICES", json.dumps(PRICES))
    provider.batch_delay = 0.3
    result = scheduler.run(batched(model, 30))
    assert result.status == "success", result.error
    assert [r["response"] for r in result.shared["ask"]["results"]] == [f"echo: {p}" for p in prompts(30)]
    assert len(provider.batches_created) == 1 and provider.batches_created[0][3] == 30
    assert answered(provider) == Counter(str(i) for i in range(30))  # each line once
    assert not synced(provider)  # nothing asked synchronously
    totals = usage_totals(result.shared)
    assert totals["batch_calls"] == 30 and totals["calls"] == 30
    tokens_in, tokens_out = provider.batch_tokens()
    price = PRICES[model]
    full = (tokens_in * price["input"] + tokens_out * price["output"]) / 1e6
    assert totals["cost_usd"] == pytest.approx(full / 2) and totals["saved_usd"] == pytest.approx(full / 2)


def test_a_line_the_provider_refuses_is_the_items_error(provider: Provider) -> None:
    provider.batch_errors = lambda prompt: "this prompt is not allowed" if prompt == prompts(5)[3] else None
    result = scheduler.run(batched("openai/gpt-test", 5, error_handling="continue"))
    outcome = result.shared["ask"]
    assert outcome["success_count"] == 4 and outcome["error_count"] == 1
    (error,) = outcome["errors"]
    assert error["index"] == 3 and error["error"] == "this prompt is not allowed", error
    assert not synced(provider)


def test_what_is_not_answered_by_the_deadline_is_asked_synchronously_once(provider: Provider) -> None:
    # Half the lines finish at once, the other half never (within the test): at the 3 s deadline the batch is
    # cancelled, its 10 answers kept, and the other 10 items asked synchronously.
    provider.batch_finish = lambda position: 0.2 if position < 10 else 3600.0
    result = scheduler.run(batched("openai/gpt-test", 20, deadline=3))
    assert result.status == "success", result.error
    assert [r["response"] for r in result.shared["ask"]["results"]] == [f"echo: {p}" for p in prompts(20)]
    assert len(provider.batch_cancels) == 1
    by_batch = answered(provider)
    assert sum(by_batch.values()) == 10 and max(by_batch.values()) == 1
    asked = synced(provider)
    assert sum(asked.values()) == 10 and max(asked.values()) == 1
    assert not set(asked) & {prompts(20)[int(i)] for i in by_batch}  # never both ways
    totals = usage_totals(result.shared)
    assert totals["batch_calls"] == 10 and totals["calls"] == 20


def test_identical_requests_are_one_line(provider: Provider) -> None:
    wf = batched("openai/gpt-test", 1)
    wf["inputs"]["items"]["default"] = ["same", "other", "same"]
    result = scheduler.run(wf)
    assert [r["response"] for r in result.shared["ask"]["results"]] == ["echo: same", "echo: other", "echo: same"]
    assert provider.batches_created[0][3] == 2
    totals = usage_totals(result.shared)
    assert totals["batch_calls"] == 2 and totals["cached_calls"] == 1


def test_offline_items_do_not_make_a_provider_batch(provider: Provider) -> None:
    result = scheduler.run(batched("fake", 3))
    assert result.status == "success" and not provider.batches_created


@pytest.mark.parametrize(
    ("node", "problem"),
    [
        ({"id": "e", "type": "echo", "params": {},
          "batch": {"items": "${items}", "provider_batch": {"deadline": "1h"}}},
         "batch.provider_batch is for llm nodes only, not echo"),
        ({"id": "e", "type": "llm", "params": {"prompt": "${item}", "model": "fake"},
          "batch": {"items": "${items}", "provider_batch": {"deadline": "soon"}}},
         "batch.provider_batch.deadline must be a duration like 7d"),
        ({"id": "e", "type": "llm", "params": {"prompt": "${item}", "model": "fake"},
          "batch": {"items": "${items}", "provider_batch": {}}},
         "deadline"),
    ],
)  # fmt: skip
def test_provider_batch_is_refused_where_it_cannot_go(node: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        scheduler.compile({"nodes": [node], "inputs": {"items": {"default": []}}})


def test_a_sub_workflow_may_not_wait_for_provider_batches() -> None:
    sub = batched("fake", 2)
    parent = {"nodes": [{"id": "sub", "type": "workflow", "params": {"workflow": sub}}]}
    with pytest.raises(ValidationError, match="node 'ask': a provider batch waits at the run's top level only"):
        scheduler.compile(parent)


def test_answers_from_a_provider_batch_are_not_held_to_the_rate_limit(provider: Provider) -> None:
    # One request per 1,000 s: were the answered items admitted like requests, the second would wait 1,000 s.
    wf = batched("openai/gpt-test", 20)
    wf["nodes"][0]["rate_limit"] = {"key": "slow-model", "requests_per_second": 0.001}
    result = scheduler.run(wf)
    assert result.status == "success" and result.shared["ask"]["success_count"] == 20
    assert not synced(provider)


def test_a_schema_answer_comes_back_from_an_anthropic_batch_as_data(provider: Provider) -> None:
    wf = batched("anthropic/claude-test", 3)
    schema = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
    wf["nodes"][0]["params"]["schema"] = schema
    result = scheduler.run(wf)
    assert result.status == "success", result.error
    assert all(isinstance(r["data"]["label"], str) for r in result.shared["ask"]["results"])
    assert len(provider.batches_created) == 1 and not synced(provider)


def test_lines_a_batch_left_when_it_expired_are_asked_synchronously(provider: Provider) -> None:
    provider.batch_finish = lambda position: 0.1 if position % 2 == 0 else 3600.0
    provider.batch_expire = 1.0  # the provider gives up before the deadline
    result = scheduler.run(batched("openai/gpt-test", 6))
    assert [r["response"] for r in result.shared["ask"]["results"]] == [f"echo: {p}" for p in prompts(6)]
    assert sorted(synced(provider)) == sorted(prompts(6)[1::2]) and not provider.batch_cancels


def test_a_group_the_budget_cannot_hold_is_not_sent(provider: Provider) -> None:
    wf = batched("openai/gpt-test", 10)
    wf["budget"] = {"tokens": 100}  # each line may bill up to ~4,100 tokens (no max_tokens): the group is refused
    with pytest.raises(BudgetExhausted):
        scheduler.run(wf)
    assert not provider.batches_created
