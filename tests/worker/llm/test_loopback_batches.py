"""The loopback provider's batch APIs (tests/support/llm_batches.py) through the official clients: an OpenAI batch (a
JSONL file uploaded, its output and error files) and an Anthropic message batch (its results) answer each line as the
sync route answers the same request, once however often read, billed apart from the sync routes; a line can fail
alone; a cancel keeps the finished lines and answers no other; at expiry the unfinished lines expire; a list shows
the batches newest first with their metadata; too many lines and a wrong key are refused as the providers refuse."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import anthropic
import openai
import pytest
from anthropic.types.messages import MessageBatch
from openai.types import Batch
from openai.types.chat import ChatCompletion

from tests.support.llm_server import KEY, Provider, serving

T = TypeVar("T")
ENDPOINT = "/v1/chat/completions"
SCHEMA = {
    "type": "object",
    "properties": {"label": {"enum": ["positive", "negative"]}, "summary": {"type": "string"}},
    "required": ["label", "summary"],
    "additionalProperties": False,
}


def chat(prompt: str, model: str = "gpt-test", **params: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], **params}


def message(prompt: str, **params: Any) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 50, "messages": [{"role": "user", "content": prompt}], **params}


def openai_client(provider: Provider, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=f"{provider.url}/v1", max_retries=0)


def anthropic_client(provider: Provider, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=key, base_url=provider.url, max_retries=0)


def submit(client: openai.OpenAI, requests: dict[str, Any], metadata: dict[str, str] | None = None) -> Batch:
    """An OpenAI batch of these chat requests by custom_id: their JSONL file uploaded, then the batch of it."""
    rows = [{"custom_id": key, "method": "POST", "url": ENDPOINT, "body": body} for key, body in requests.items()]
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    file = client.files.create(file=("batch.jsonl", data), purpose="batch")
    return client.batches.create(input_file_id=file.id, endpoint=ENDPOINT, completion_window="24h", metadata=metadata)


def send(client: anthropic.Anthropic, requests: dict[str, Any]) -> MessageBatch:
    """An Anthropic message batch of these messages requests by custom_id."""
    return client.messages.batches.create(requests=[{"custom_id": key, "params": p} for key, p in requests.items()])


def lines(client: openai.OpenAI, file_id: str | None) -> dict[str, dict[str, Any]]:
    """An OpenAI output or error file's lines, by custom_id."""
    assert file_id is not None
    rows = [json.loads(text) for text in client.files.content(file_id).text.splitlines()]
    return {row["custom_id"]: row for row in rows}


def until(read: Callable[[], T], done: Callable[[T], bool]) -> T:
    """Poll `read` until `done`: the server computes a batch's state when read, so there is no event to wait on."""
    deadline = time.monotonic() + 10
    while not done(value := read()):
        assert time.monotonic() < deadline, f"still {value}"
        time.sleep(0.02)
    return value


def test_an_openai_batch_answers_each_line_as_the_chat_route_does_once_billed_apart() -> None:
    review = {"type": "json_schema", "json_schema": {"name": "review", "schema": SCHEMA}}
    system = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "and in French?"}]
    requests = {"hello": chat("say hello"), "brief": {"model": "gpt-test", "messages": system},
                "review": chat("great phone", response_format=review)}  # fmt: skip
    with serving(Provider(batch_delay=0.3)) as provider:
        client = openai_client(provider)
        batch = submit(client, requests, {"run": "r1"})
        assert (batch.status, batch.metadata, batch.in_progress_at) == ("validating", {"run": "r1"}, None)
        read = client.batches.retrieve(batch.id)
        assert (read.status, read.output_file_id, read.in_progress_at) == ("in_progress", None, batch.created_at)
        done = until(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed")
        assert done.request_counts is not None and done.usage is not None and done.completed_at is not None
        counts = done.request_counts
        assert (counts.total, counts.completed, counts.failed, done.error_file_id) == (3, 3, 0, None)
        output = lines(client, done.output_file_id)
        assert provider.tokens() == (0, 0)  # nothing billed as sync
        for custom_id, body in requests.items():
            assert (output[custom_id]["response"]["status_code"], output[custom_id]["error"]) == (200, None)
            answer = ChatCompletion.model_validate(output[custom_id]["response"]["body"])
            sync = client.chat.completions.create(**body)
            assert (answer.choices[0].message.content, answer.usage) == (sync.choices[0].message.content, sync.usage)
        data = json.loads(output["review"]["response"]["body"]["choices"][0]["message"]["content"])
        assert data.keys() == {"label", "summary"}
        assert provider.batch_tokens() == provider.tokens()  # the same words, billed apart
        assert done.usage.total_tokens == sum(provider.batch_tokens())
        assert provider.billed() == [("openai", "gpt-test", 200)] * 3  # the sync calls only
    assert sorted(provider.batch_answered) == [("openai", batch.id, custom_id, 200) for custom_id in sorted(requests)]
    assert provider.batches_created == [("openai", batch.id, {"run": "r1"}, 3)]


def test_an_anthropic_batch_answers_each_request_as_the_messages_route_does_in_shuffled_order() -> None:
    requests = {f"plain-{n}": message(f"prompt {n}") for n in range(8)}
    requests["system"] = message("and in French?", system="be brief")
    tool = {"tools": [{"name": "review", "input_schema": SCHEMA}], "tool_choice": {"type": "tool", "name": "review"}}
    requests["review"] = message("great phone", **tool)
    with serving(Provider(batch_finish=lambda _: 0.0)) as provider:
        client = anthropic_client(provider)
        batch = send(client, requests)
        assert (batch.processing_status, batch.results_url) == ("in_progress", None)
        assert batch.request_counts.processing == 10
        done = until(lambda: client.messages.batches.retrieve(batch.id), lambda b: b.processing_status == "ended")
        assert (done.request_counts.succeeded, done.request_counts.processing) == (10, 0)
        assert done.results_url == f"{provider.url}/v1/messages/batches/{batch.id}/results"
        results = list(client.messages.batches.results(batch.id))
        assert [one.custom_id for one in results] != list(requests)  # matched by custom_id, not by order
        for one in results:
            assert one.result.type == "succeeded"
            sync = client.messages.create(**requests[one.custom_id])
            assert (one.result.message.content, one.result.message.usage) == (sync.content, sync.usage)
        assert {one.custom_id: one.result.message.stop_reason for one in results}["review"] == "tool_use"
        assert provider.batch_tokens() == provider.tokens()
    assert sorted(provider.batch_answered) == [
        ("anthropic", batch.id, custom_id, 200) for custom_id in sorted(requests)
    ]


def test_a_line_fails_alone_as_each_api_reports_it_billing_nothing() -> None:
    provider = Provider(batch_errors=lambda last: "prompt is too long" if last == "too long" else None)
    with serving(provider):
        client = openai_client(provider)
        batch = submit(client, {"ok": chat("fine"), "long": chat("too long"), "other": chat("fine", model="gpt-other")})
        done = until(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "completed")
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (1, 2)
        assert list(lines(client, done.output_file_id)) == ["ok"]
        failed = lines(client, done.error_file_id)
        assert {key: row["response"]["status_code"] for key, row in failed.items()} == {"long": 400, "other": 404}
        assert failed["long"]["response"]["body"]["error"]["message"] == "prompt is too long"
        assert failed["long"]["error"] is None  # the API's answer, not a batch error
        assert provider.batch_tokens() == (1, 2)  # `fine` -> `echo: fine`; the failed lines bill nothing

        claude = anthropic_client(provider)
        sent = send(claude, {"ok": message("fine"), "long": message("too long")})
        ended = until(lambda: claude.messages.batches.retrieve(sent.id), lambda b: b.processing_status == "ended")
        assert (ended.request_counts.succeeded, ended.request_counts.errored) == (1, 1)
        results = {one.custom_id: one.result for one in claude.messages.batches.results(sent.id)}
        assert (results["ok"].type, results["long"].type) == ("succeeded", "errored")
        error = results["long"].error.error
        assert (error.type, error.message) == ("invalid_request_error", "prompt is too long")
    assert sorted(status for *_, status in provider.batch_answered) == [200, 200, 400, 400, 404]


def test_a_cancel_keeps_the_finished_lines_and_answers_no_other() -> None:
    with serving(Provider(batch_finish=lambda n: 0.0 if n < 2 else 60.0)) as provider:
        client = openai_client(provider)
        batch = submit(client, {f"q{n}": chat(f"prompt {n}") for n in range(4)})
        read = client.batches.retrieve(batch.id)
        assert read.request_counts is not None
        assert (read.status, read.request_counts.completed) == ("in_progress", 2)
        cancelling = client.batches.cancel(batch.id)
        assert (cancelling.status, cancelling.cancelled_at) == ("cancelling", None)
        assert cancelling.cancelling_at is not None
        done = client.batches.retrieve(batch.id)
        assert (done.status, done.error_file_id) == ("cancelled", None)
        assert done.cancelled_at is not None
        assert sorted(lines(client, done.output_file_id)) == ["q0", "q1"]
        with pytest.raises(openai.BadRequestError):
            client.batches.cancel(batch.id)  # it has ended

        claude = anthropic_client(provider)
        sent = send(claude, {f"m{n}": message(f"prompt {n}") for n in range(4)})
        canceling = claude.messages.batches.cancel(sent.id)
        assert (canceling.processing_status, canceling.ended_at) == ("canceling", None)
        assert canceling.cancel_initiated_at is not None
        ended = claude.messages.batches.retrieve(sent.id)
        counts = ended.request_counts
        assert (ended.processing_status, counts.succeeded, counts.canceled, counts.processing) == ("ended", 2, 2, 0)
        results = {one.custom_id: one.result.type for one in claude.messages.batches.results(sent.id)}
        assert results == {"m0": "succeeded", "m1": "succeeded", "m2": "canceled", "m3": "canceled"}
    assert provider.batch_cancels == [batch.id, sent.id]
    assert sorted(custom_id for _, _, custom_id, _ in provider.batch_answered) == ["m0", "m1", "q0", "q1"]


def test_at_expiry_the_unfinished_lines_expire_and_the_finished_keep_their_answers() -> None:
    with serving(Provider(batch_finish=lambda n: 0.0 if n == 0 else 60.0, batch_expire=0.2)) as provider:
        client = openai_client(provider)
        batch = submit(client, {f"q{n}": chat(f"prompt {n}") for n in range(3)})
        done = until(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "expired")
        assert done.request_counts is not None and done.expired_at is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (1, 2)
        assert list(lines(client, done.output_file_id)) == ["q0"]
        expired = lines(client, done.error_file_id)
        assert {key: (row["response"], row["error"]["code"]) for key, row in expired.items()} == {
            "q1": (None, "batch_expired"),
            "q2": (None, "batch_expired"),
        }

        claude = anthropic_client(provider)
        sent = send(claude, {f"m{n}": message(f"prompt {n}") for n in range(3)})
        ended = until(lambda: claude.messages.batches.retrieve(sent.id), lambda b: b.processing_status == "ended")
        assert (ended.request_counts.succeeded, ended.request_counts.expired) == (1, 2)
        results = {one.custom_id: one.result.type for one in claude.messages.batches.results(sent.id)}
        assert results == {"m0": "succeeded", "m1": "expired", "m2": "expired"}
    assert sorted(custom_id for _, _, custom_id, _ in provider.batch_answered) == ["m0", "q0"]


def test_a_list_shows_the_batches_newest_first_with_their_metadata() -> None:
    with serving() as provider:
        client = openai_client(provider)
        made = [submit(client, {"q": chat("hi")}, {"run": f"r{n}"}).id for n in range(3)]
        page = client.batches.list(limit=2)
        assert ([one.id for one in page.data], page.has_more) == ([made[2], made[1]], True)
        every = [(one.id, one.metadata) for one in client.batches.list(limit=2)]  # the pages through `after`
        assert every == [(made[2], {"run": "r2"}), (made[1], {"run": "r1"}), (made[0], {"run": "r0"})]

        claude = anthropic_client(provider)
        sent = [send(claude, {"m": message("hi")}).id for _ in range(2)]
        assert [one.id for one in claude.messages.batches.list(limit=1)] == sent[::-1]  # the pages through `after_id`
    assert [(protocol, metadata) for protocol, _, metadata, _ in provider.batches_created] == [
        ("openai", {"run": "r0"}),
        ("openai", {"run": "r1"}),
        ("openai", {"run": "r2"}),
        ("anthropic", None),
        ("anthropic", None),
    ]


def test_too_many_lines_and_a_wrong_key_are_refused() -> None:
    with serving() as provider:
        with pytest.raises(openai.BadRequestError, match="50,000"):
            submit(openai_client(provider), {str(n): {} for n in range(50_001)})
        with pytest.raises(anthropic.BadRequestError, match="100,000"):
            send(anthropic_client(provider), {str(n): {} for n in range(100_001)})
        with pytest.raises(openai.AuthenticationError):
            openai_client(provider, "sk-wrong").batches.list()
        with pytest.raises(anthropic.AuthenticationError):
            anthropic_client(provider, "sk-wrong").messages.batches.list()
    assert provider.batches_created == []
