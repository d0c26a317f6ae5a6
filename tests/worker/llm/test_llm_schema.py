"""Structured output: an `llm` node's `schema` is sent the way each API takes it (OpenAI `response_format`, an
Anthropic tool forced by `tool_choice`) to a loopback provider the official clients reach over HTTP
(tests/support/llm_server.py); the parsed answer lands in `data`; an invalid answer is asked again with what was
wrong and every request is billed and recorded; one still invalid fails its item with SchemaError at its JSON path;
a bad schema is one validation line; the offline fake answers valid objects, on the cluster too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import scheduler
from ir.errors import SchemaError
from scheduler.localcluster import Cluster
from tests.scheduler.cli.test_cli import run_cli
from tests.support import llm_server
from tests.support.cluster import PLUGINS
from tests.support.llm_server import Provider
from worker.llm import providers

#: A closed schema (every property required, no others): OpenAI's strict mode takes it.
REVIEW = {
    "title": "review",
    "type": "object",
    "properties": {
        "label": {"enum": ["positive", "negative", "neutral"]},
        "summary": {"type": "string", "maxLength": 200},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
        "urgent": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    },
    "required": ["label", "summary", "stars", "urgent", "tags"],
    "additionalProperties": False,
}
MODELS = {"openai": "openai/gpt-test", "anthropic": "anthropic/claude-test"}


def classify(model: str, prompt: str = "${item}", **params: Any) -> dict[str, Any]:
    return {"id": "classify", "type": "llm", "params": {"prompt": prompt, "model": model, "schema": REVIEW, **params}}


def batch(model: str, params: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    node = classify(model, **(params or {}))
    return {"nodes": [{**node, "batch": {"items": "${items}", "error_handling": "continue", **options}}]}


def inputs(items: list[str]) -> dict[str, Any]:
    """The items, and the root `__llm_calls__` list batch items append their records to."""
    return {"items": items, "__llm_calls__": []}


def fifth_invalid(prompt: str) -> int:
    """One invalid first answer for every fifth item (`item-0`, `item-5`, ...)."""
    return 1 if int(prompt.rsplit("-", 1)[1]) % 5 == 0 else 0


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_a_valid_answer_lands_in_data_and_the_schema_is_sent_as_the_api_takes_it(
    provider: Provider, protocol: str
) -> None:
    result = scheduler.run({"nodes": [classify(MODELS[protocol], "the delivery was late but the food was great")]})
    data = result.shared["classify"]["data"]
    jsonschema.validate(data, REVIEW)
    assert data["summary"] == "the delivery was late but the food was great"  # the server's string fields carry it
    assert json.loads(result.shared["classify"]["response"]) == data
    [body] = provider.bodies
    if protocol == "openai":
        assert body["response_format"] == {
            "type": "json_schema", "json_schema": {"name": "review", "schema": REVIEW, "strict": True}
        }  # fmt: skip
    else:
        assert body["tools"][0]["input_schema"] == REVIEW and body["tools"][0]["name"] == "review"
        assert body["tool_choice"] == {"type": "tool", "name": "review"}
    [call] = result.shared["__llm_calls__"]
    assert (call["input_tokens"], call["output_tokens"]) == provider.tokens() and call["output_tokens"] > 0


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_a_fifth_of_first_answers_invalid_costs_at_most_a_quarter_more_requests(
    provider: Provider, protocol: str
) -> None:
    provider.invalid = fifth_invalid
    items = [f"item-{i}" for i in range(40)]
    result = scheduler.run(batch(MODELS[protocol], parallel=True, max_concurrent=4), inputs(items))
    results = result.shared["classify"]["results"]
    assert not result.shared["classify"].get("errors")
    for item, entry in zip(items, results, strict=True):
        jsonschema.validate(entry["data"], REVIEW)
        assert entry["data"]["summary"] == item
    billed = len(provider.billed())
    assert billed == 48 and billed <= 1.25 * len(items)  # 40 answers, and 8 asked again
    calls = result.shared["__llm_calls__"]  # every request its own record, the invalid answers' too
    assert len(calls) == billed
    assert (sum(c["input_tokens"] for c in calls), sum(c["output_tokens"] for c in calls)) == provider.tokens()
    again = [b["messages"] for b in provider.bodies if len(b["messages"]) > 1]
    assert len(again) == 8
    assert all(m[1]["role"] == "assistant" and m[2]["role"] == "user" for m in again)
    assert all("$.label: ['not', 'valid'] is not one of" in m[2]["content"] for m in again)


def test_an_answer_that_is_not_json_is_asked_again(provider: Provider) -> None:
    provider.invalid, provider.prose = (lambda prompt: 1), True
    result = scheduler.run({"nodes": [classify(MODELS["openai"], "great food")]})
    jsonschema.validate(result.shared["classify"]["data"], REVIEW)
    assert len(provider.billed()) == 2
    assert "$: not JSON (Expecting value" in provider.bodies[1]["messages"][-1]["content"]


def test_a_429_on_the_asking_again_goes_on_from_the_answer_already_billed(provider: Provider) -> None:
    provider.invalid, provider.throttle_again = (lambda prompt: 1), 1
    result = scheduler.run({"nodes": [classify(MODELS["openai"], "great food")]})
    jsonschema.validate(result.shared["classify"]["data"], REVIEW)
    assert [status for _, _, status in provider.requests] == [200, 429, 200]  # the first answer not asked again
    calls = result.shared["__llm_calls__"]
    assert [c["cached"] for c in calls] == [False, False]  # both billed, both recorded with their tokens
    assert (sum(c["input_tokens"] for c in calls), sum(c["output_tokens"] for c in calls)) == provider.tokens()


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
def test_an_answer_still_invalid_after_the_retries_fails_its_item_with_schema_error(
    provider: Provider, protocol: str
) -> None:
    provider.invalid = lambda prompt: 99 if prompt == "item-1" else 0
    result = scheduler.run(batch(MODELS[protocol], {"schema_retries": 1}), inputs(["item-0", "item-1", "item-2"]))
    [error] = result.shared["classify"]["errors"]
    assert (error["index"], error["exception_type"]) == (1, "SchemaError")
    assert error["error"] == "$.label: ['not', 'valid'] is not one of ['positive', 'negative', 'neutral']"
    assert [r["data"]["summary"] for r in result.shared["classify"]["results"] if r] == ["item-0", "item-2"]
    assert len(provider.billed()) == 4  # item 1: its answer and one more (schema_retries 1), both billed
    assert len(result.shared["__llm_calls__"]) == 4


def test_a_single_node_still_invalid_fails_the_run_naming_the_path(provider: Provider) -> None:
    provider.invalid = lambda prompt: 99
    with pytest.raises(SchemaError, match=r"^\$\.label: \['not', 'valid'\] is not one of"):
        scheduler.run({"nodes": [classify(MODELS["openai"], "hello", schema_retries=0)]})
    assert len(provider.billed()) == 1


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "object", "properties": {"n": {"type": "integr"}}},
         "params.schema: not a valid JSON Schema: $.properties.n.type: 'integr' is not valid under any"),
        ({"type": "array", "items": {"type": "string"}}, 'params.schema: its root must be {"type": "object", ...}'),
        ("an object please", "params.schema: must be a dict, got str"),
    ],
)  # fmt: skip
@pytest.mark.processes
def test_a_bad_schema_is_one_validation_line(provider: Provider, tmp_path: Path, schema: Any, problem: str) -> None:
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({"nodes": [classify(MODELS["openai"], "hi", schema=schema)]}))
    for command in ("validate", "run"):
        proc = run_cli(command, wf)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "(id 'classify')" in lines[0] and problem in lines[0], lines[0]
    assert provider.requests == []


@pytest.mark.processes
def test_a_negative_schema_retries_is_one_validation_line(tmp_path: Path) -> None:
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({"nodes": [classify("fake", "hi", schema_retries=-1)]}))
    proc = run_cli("validate", wf)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "params.schema_retries: must be a whole number >= 0, got -1" in proc.stderr


def test_strict_mode_is_asked_only_for_a_schema_it_takes() -> None:
    assert providers.strict(REVIEW)
    assert not providers.strict({**REVIEW, "additionalProperties": True})
    assert not providers.strict({**REVIEW, "required": ["label"]})
    nested = {**REVIEW, "properties": {**REVIEW["properties"], "author": {"type": "object", "properties": {
        "name": {"type": "string"}}}}, "required": [*REVIEW["required"], "author"]}  # fmt: skip
    assert not providers.strict(nested)  # an inner object left open


def test_the_fake_answers_a_deterministic_valid_object_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHORDFLOW_LLM_MODEL", "fake")
    schema = {
        "type": "object",
        "properties": {
            **REVIEW["properties"],
            "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
            "note": {"type": ["string", "null"], "minLength": 100},
            "kind": {"const": "review"},
            "author": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}},
            "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "none": {"type": "array", "maxItems": 0},
        },
    }
    items = ["good", "bad", "so so", "good"]
    wf = {"nodes": [{"id": "c", "type": "llm", "params": {"prompt": "${item}", "schema": schema},
                     "batch": {"items": "${items}"}}]}  # fmt: skip
    first = scheduler.run(wf, inputs(items)).shared
    data = [r["data"] for r in first["c"]["results"]]
    for value in data:
        jsonschema.validate(value, schema)
        assert len(value["note"]) == 100 and value["none"] == [] and value["kind"] == "review"
    assert data[0] == data[3] and data[0] != data[1]  # a function of the prompt
    assert scheduler.run(wf, {"items": items}).shared["c"]["results"] == first["c"]["results"]
    assert [c["model"] for c in first["__llm_calls__"]] == ["fake"] * 4


@pytest.mark.processes
def test_a_cluster_batch_retries_invalid_answers_and_fails_the_hopeless_item(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two solo workers with the loopback provider's key; 30 items in chunks of 5: a fifth of the first answers
    # invalid, item-7's answers always. The retries happen on the workers, the records and the SchemaError travel.
    def owed(prompt: str) -> int:
        return 99 if prompt == "item-7" else fifth_invalid(prompt)

    monkeypatch.delenv("CHORDFLOW_LLM_MODEL", raising=False)
    with llm_server.serving(Provider(invalid=owed)) as provider:
        for name, value in llm_server.environment(provider).items():  # the workers' environment is this one's
            monkeypatch.setenv(name, value)
        cluster = Cluster(tmp_path, plugins=PLUGINS)
        previous = cluster.apply_env()
        try:
            cluster.start_worker("s1")
            cluster.start_worker("s2")
            items = [f"item-{i}" for i in range(30)]
            run_id = scheduler.submit(batch(MODELS["anthropic"], chunk_size=5), inputs(items))
            result = scheduler.wait(run_id, timeout=120)
        finally:
            cluster.restore_env(previous)
            cluster.stop()
    assert result.status == "success", result.error
    out = result.shared["classify"]
    assert [(e["index"], e["exception_type"]) for e in out["errors"]] == [(7, "SchemaError")]
    assert out["errors"][0]["error"].startswith("$.label: ")
    for i, entry in enumerate(out["results"]):
        if i != 7:
            jsonschema.validate(entry["data"], REVIEW)
            assert entry["data"]["summary"] == items[i]
    billed = len(provider.billed())
    assert billed == 30 + 6 + 2  # 6 of the fifth asked again once, item-7 twice more (schema_retries 2)
    assert len(result.shared["__llm_calls__"]) == billed


def test_the_fake_with_a_schema_answers_on_the_cluster(celery_cluster: Cluster) -> None:
    wf = {"nodes": [{"id": "c", "type": "llm", "params": {"prompt": "${item}", "model": "fake", "schema": REVIEW},
                     "batch": {"items": "${items}", "chunk_size": 4}}]}  # fmt: skip
    items = [f"text {i}" for i in range(12)]
    cluster = scheduler.wait(scheduler.submit(wf, {"items": items}), timeout=120)
    local = scheduler.run(wf, {"items": items})
    assert cluster.status == "success", cluster.error
    assert cluster.shared["c"]["results"] == local.shared["c"]["results"]
    for entry in cluster.shared["c"]["results"]:
        jsonschema.validate(entry["data"], REVIEW)
