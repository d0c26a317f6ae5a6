"""The providers' batch APIs through their official clients: OpenAI's `/v1/files` + `/v1/batches` and Anthropic's
`/v1/messages/batches`. Each line's request is the body a synchronous call sends (worker/llm/providers.py), its
`custom_id` the item's index; answers are read back into the same `Answer` a call returns.

What the orchestration (worker/llm/provider_batches.py) needs of a provider: `create` a batch (OpenAI's carries
`metadata` naming the run and the group), `find` one created for the group before its id could be recorded,
`look` at its progress, read its `results`, `cancel` it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ir.errors import SameForEveryItem
from worker.llm import providers
from worker.llm.providers import Answer, Model, Request

#: The most lines and bytes one batch takes, by provider (OpenAI: 50,000 requests, a 200 MB file; Anthropic:
#: 100,000 requests, 256 MB).
LIMITS = {"openai": (50_000, 200_000_000), "anthropic": (100_000, 256_000_000)}
#: The endpoint OpenAI's batch lines call.
CHAT = "/v1/chat/completions"


@dataclass(frozen=True)
class Progress:
    """Where a provider batch stands: `state` running, cancelling or ended; its lines answered and refused."""

    state: str
    total: int
    done: int
    failed: int


@dataclass(frozen=True)
class Line:
    """One item's request in a provider batch."""

    index: int
    model: Model
    request: Request

    def body(self) -> dict[str, Any]:
        if self.model.provider == "openai":
            return providers.openai_body(self.model, self.request)
        return providers.anthropic_body(self.model, self.request)

    def size(self) -> int:
        """Bytes this line takes in a batch (about: the limits are far above a line)."""
        return len(json.dumps(self.body())) + 100


def _refusing(provider: str, call: Any) -> Any:
    """`call()`, but for an error that stops every line alike (the key refused): SameForEveryItem."""
    try:
        return call()
    except Exception as exc:
        status = getattr(exc, "status_code", None)
        if status in (401, 403):
            raise SameForEveryItem(f"{provider} batches: the provider refused the key (HTTP {status})") from exc
        raise


def create(provider: str, base_url: str | None, lines: list[Line], metadata: dict[str, str]) -> str:
    """A new provider batch of `lines`; its id."""
    client = providers.client(provider, base_url)
    if provider == "openai":
        text = "\n".join(
            json.dumps({"custom_id": str(line.index), "method": "POST", "url": CHAT, "body": line.body()})
            for line in lines
        )
        upload = _refusing(provider, lambda: client.files.create(file=("chordflow.jsonl", text.encode()),
                                                                  purpose="batch"))  # fmt: skip
        made = _refusing(provider, lambda: client.batches.create(
            input_file_id=upload.id, endpoint=CHAT, completion_window="24h", metadata=metadata
        ))  # fmt: skip
        return str(made.id)
    requests = [{"custom_id": str(line.index), "params": line.body()} for line in lines]
    return str(_refusing(provider, lambda: client.messages.batches.create(requests=requests)).id)


def find(provider: str, base_url: str | None, metadata: dict[str, str], since: float, count: int,
         taken: set[str]) -> str | None:  # fmt: skip
    """The id of a batch created for this group at or after `since` (epoch seconds) whose id was never recorded:
    OpenAI's by its `metadata`; Anthropic's batches carry none, so the one of `count` requests created since then
    that no other group of the run has `taken`."""
    client = providers.client(provider, base_url)
    if provider == "openai":
        for batch in client.batches.list(limit=100):
            if batch.created_at < since - 5:
                return None  # newest first: older ones cannot be this group's
            if (batch.metadata or {}) == metadata:
                return str(batch.id)
        return None
    for batch in client.messages.batches.list(limit=100):
        if batch.created_at.timestamp() < since - 5:
            return None
        counts = batch.request_counts
        total = counts.processing + counts.succeeded + counts.errored + counts.canceled + counts.expired
        if total == count and batch.id not in taken:
            return str(batch.id)
    return None


def look(provider: str, base_url: str | None, batch_id: str) -> Progress:
    client = providers.client(provider, base_url)
    if provider == "openai":
        batch = client.batches.retrieve(batch_id)
        counts = batch.request_counts
        total, done, failed = (counts.total, counts.completed, counts.failed) if counts else (0, 0, 0)
        state = {"cancelling": "cancelling"}.get(batch.status, "running")
        if batch.status in ("completed", "expired", "cancelled", "failed"):
            state = "ended"
        return Progress(state, total, done, failed)
    batch = client.messages.batches.retrieve(batch_id)
    counts = batch.request_counts
    total = counts.processing + counts.succeeded + counts.errored + counts.canceled + counts.expired
    state = {"in_progress": "running", "canceling": "cancelling"}.get(batch.processing_status, "ended")
    return Progress(state, total, counts.succeeded, counts.errored)


def results(
    provider: str, base_url: str | None, batch_id: str, lines: dict[int, Line]
) -> Iterator[tuple[int, Answer | str]]:
    """(index, its answer or the provider's error message) for each line the ended batch answered; a line it did not
    (cancelled, expired, the batch failed) is not among them."""
    client = providers.client(provider, base_url)
    if provider == "openai":
        yield from _openai_results(client, client.batches.retrieve(batch_id), lines)
        return
    for entry in client.messages.batches.results(batch_id):
        line = lines.get(_index(entry.custom_id))
        if line is None:
            continue
        if entry.result.type == "succeeded":
            answer = providers.anthropic_answer(entry.result.message, line.model, line.request.schema)
            yield line.index, _batched(answer)
        elif entry.result.type == "errored":
            error = getattr(entry.result.error, "error", None)
            yield line.index, str(getattr(error, "message", None) or entry.result.error)


def _openai_results(client: Any, batch: Any, lines: dict[int, Line]) -> Iterator[tuple[int, Answer | str]]:
    from openai.types.chat import ChatCompletion  # a worker that never calls a model never pays its import

    for file_id in (batch.output_file_id, batch.error_file_id):
        if not file_id:
            continue
        for raw in _lines(client.files.content(file_id).text.splitlines()):
            line = lines.get(_index(raw.get("custom_id")))
            if line is None:
                continue
            response, error = raw.get("response") or {}, raw.get("error") or {}
            if response.get("status_code") == 200:
                answer = providers.openai_answer(ChatCompletion.model_validate(response["body"]), line.model)
                yield line.index, _batched(answer)
            elif error.get("code") not in ("batch_expired", "batch_cancelled"):  # unanswered: asked again
                body = response.get("body") or {}
                message = (body.get("error") or {}).get("message") or error.get("message") or json.dumps(raw)
                yield line.index, str(message)


def cancel(provider: str, base_url: str | None, batch_id: str) -> None:
    client = providers.client(provider, base_url)
    if provider == "openai":
        client.batches.cancel(batch_id)
    else:
        client.messages.batches.cancel(batch_id)


def _batched(answer: Answer) -> Answer:
    return Answer(answer.text, answer.model, answer.input_tokens, answer.output_tokens, batch=True)


def _index(custom_id: Any) -> int | None:
    return int(custom_id) if isinstance(custom_id, str) and custom_id.isdigit() else None


def _lines(texts: Iterable[str]) -> Iterator[dict[str, Any]]:
    for text in texts:
        if text.strip():
            yield json.loads(text)
