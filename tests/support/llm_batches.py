"""The loopback model provider's batch APIs (tests/support/llm_server.py routes them here, on its port): OpenAI's
files and batches of chat completions (`/v1/files`, `/v1/batches`) and Anthropic's message batches
(`/v1/messages/batches`), on the wire as the official clients call them, so that batch clients are tested against
the protocols themselves.

A batch's state is computed from the time since its creation whenever it is read (no thread moves it on): line i
finishes `batch_finish(i)` seconds after creation (`batch_delay` without it), and the batch ends when every line
has finished (OpenAI `completed`, Anthropic `ended`), at `batch_expire` (the lines unfinished then expire) or when
cancelled (the lines unfinished then are cancelled). A finished line is answered once, when first read, by the sync
routes' own code (llm_server.reply) but never throttled, delayed or held, and billed apart from them
(`batch_input_tokens`, `batch_output_tokens`, `batch_answered`); `batch_errors(its last message)` fails a line
instead, as does a model the provider does not know. Results come shuffled (seeded by the batch's id), as both
providers warn they may: clients match them by custom_id.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.llm_server import Provider, authorized, error, reply

ENDPOINT = "/v1/chat/completions"  # the one endpoint OpenAI batches are taken for here
MOST_LINES = {"openai": 50_000, "anthropic": 100_000}  # the most requests a batch holds
WINDOW = 24 * 3600.0  # both providers' completion window: a batch expires after it without `batch_expire`
EXPIRED = "This request could not be executed before the completion window expired."

Content = dict[str, Any] | bytes  # a JSON payload, or a file's bytes


@dataclass
class File:
    """An OpenAI file: its object (what `files.retrieve` returns) and its bytes."""

    info: dict[str, Any]
    content: bytes


@dataclass
class Line:
    """A request of a batch."""

    custom_id: str
    body: dict[str, Any]  # the chat request: OpenAI's `body`, Anthropic's `params`
    at: float  # when it finishes (time.time())
    status: int | None = None  # once answered: 200, or its error's status
    payload: dict[str, Any] | None = None  # once answered: the chat's answer, or the error's body


@dataclass
class Job:
    """A batch of either protocol."""

    protocol: str
    id: str
    created: float
    expires: float
    lines: list[Line]
    metadata: dict[str, str] | None
    input_file_id: str = ""  # OpenAI
    cancelled: float | None = None  # when its cancel was asked
    written: bool = False  # OpenAI: its output and error files are made (once it ended)
    output_file_id: str | None = None
    error_file_id: str | None = None


def route(provider: Provider, method: str, path: str, headers: Message, raw: bytes) -> tuple[int, Content]:
    """(status, JSON payload or file bytes) for a request to a batch API."""
    url = urlsplit(path)
    parts = url.path.strip("/").split("/")
    query = {name: values[-1] for name, values in parse_qs(url.query).items()}
    protocol = "anthropic" if parts[:2] == ["v1", "messages"] else "openai"
    if not authorized(provider, protocol, headers):
        return 401, error(protocol, "authentication_error", "invalid api key")
    with provider.lock:
        answer = _routed(provider, method, parts, headers, raw, query, protocol)
    if answer is None:
        return 404, error(protocol, "not_found_error", f"no {method} {url.path}")
    if method == "POST" and parts[-1] == "batches" and provider.answer_creates is not None:
        provider.answer_creates.wait(60)  # the batch exists; its creator hears of it only now (or never)
    return answer


def _routed(provider: Provider, method: str, parts: list[str], headers: Message, raw: bytes,
            query: dict[str, str], protocol: str) -> tuple[int, Content] | None:  # fmt: skip
    """The answer to a batch API request (None: no such route), `provider.lock` held."""
    job = provider.batch_jobs.get(parts[-2] if parts[-1] in ("cancel", "results") else parts[-1])
    job = job if job is not None and job.protocol == protocol else None  # the batch the path names
    file = provider.batch_files.get(parts[2] if parts[:2] == ["v1", "files"] and len(parts) > 2 else "")
    match method, parts:
        case "POST", ["v1", "files"]:
            return upload(provider, headers, raw)
        case "GET", ["v1", "files", _] if file:
            return 200, file.info
        case "GET", ["v1", "files", _, "content"] if file:
            return 200, file.content
        case "POST", ["v1", "batches"]:
            return create_openai(provider, loads(raw))
        case "POST", ["v1", "messages", "batches"]:
            return create_anthropic(provider, loads(raw))
        case "GET", ["v1", "batches"] | ["v1", "messages", "batches"]:
            return 200, listing(provider, protocol, query)
        case "GET", ["v1", "batches", _] | ["v1", "messages", "batches", _] if job:
            return 200, view(provider, job)
        case "POST", ["v1", "batches", _, "cancel"] | ["v1", "messages", "batches", _, "cancel"] if job:
            return cancel(provider, job)
        case "GET", ["v1", "messages", "batches", _, "results"] if job:
            return results(provider, job)
    return None


def loads(raw: bytes) -> dict[str, Any]:
    """A request's JSON object ({} when it is none: the creation says what it lacks)."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def upload(provider: Provider, headers: Message, raw: bytes) -> tuple[int, Content]:
    """OpenAI's file upload: a multipart form of the `file` and its `purpose`."""
    head = f"Content-Type: {headers.get('Content-Type')}\r\n\r\n".encode()
    form = BytesParser(policy=HTTP).parsebytes(head + raw)
    fields = {part.get_param("name", header="content-disposition"): part for part in form.iter_parts()}
    purpose = fields["purpose"].get_content() if "purpose" in fields else None
    if "file" not in fields or purpose != "batch":
        return 400, error("openai", "invalid_request_error", "upload a `file` with the purpose `batch`")
    file = fields["file"]
    return 200, add_file(provider, file.get_filename() or "batch.jsonl", "batch", file.get_payload(decode=True)).info


def add_file(provider: Provider, filename: str, purpose: str, content: bytes) -> File:
    file_id = f"file-{len(provider.batch_files) + 1:06d}"
    info = {"id": file_id, "object": "file", "bytes": len(content), "created_at": int(time.time()),
            "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None,
            "status_details": None}  # fmt: skip
    provider.batch_files[file_id] = File(info, content)
    return provider.batch_files[file_id]


def create_openai(provider: Provider, body: dict[str, Any]) -> tuple[int, Content]:
    """A batch of the input file's lines: `{"custom_id", "method": "POST", "url": ENDPOINT, "body"}` each."""
    file = provider.batch_files.get(str(body.get("input_file_id")))
    if file is None:
        return 404, error("openai", "not_found_error", f"no file {body.get('input_file_id')}")
    if body.get("endpoint") != ENDPOINT or body.get("completion_window") != "24h":
        return 400, error("openai", "invalid_request_error", f"batches are taken for {ENDPOINT} within 24h")
    try:
        requests = [json.loads(text) for text in file.content.decode().splitlines() if text.strip()]
    except ValueError:
        return 400, error("openai", "invalid_request_error", "the input file is not JSON lines")
    if not all(isinstance(r, dict) and r.get("method") == "POST" and r.get("url") == ENDPOINT for r in requests):
        return 400, error("openai", "invalid_request_error", f"every line must be a POST to {ENDPOINT}")
    job = new_job(provider, "openai", [(r.get("custom_id"), r.get("body")) for r in requests], body.get("metadata"))
    if isinstance(job, str):
        return 400, error("openai", "invalid_request_error", job)
    job.input_file_id = file.info["id"]
    return 200, openai_batch(provider, job, "validating")


def create_anthropic(provider: Provider, body: dict[str, Any]) -> tuple[int, Content]:
    """A batch of the body's `requests`: `{"custom_id", "params"}` each."""
    requests = body.get("requests")
    if not isinstance(requests, list) or not all(isinstance(r, dict) for r in requests):
        return 400, error("anthropic", "invalid_request_error", "requests: a list of {custom_id, params}")
    job = new_job(provider, "anthropic", [(r.get("custom_id"), r.get("params")) for r in requests], None)
    if isinstance(job, str):
        return 400, error("anthropic", "invalid_request_error", job)
    return 200, anthropic_batch(provider, job, "in_progress")


def new_job(provider: Provider, protocol: str, requests: list[tuple[Any, Any]], metadata: Any) -> Job | str:
    """The batch of these (custom_id, chat request) pairs, created now, or what is wrong with them."""
    ids = [custom_id for custom_id, _ in requests]
    if not 0 < len(requests) <= MOST_LINES[protocol]:
        return f"a batch holds 1 to {MOST_LINES[protocol]:,} requests, not {len(requests):,}"
    if not all(isinstance(one, str) and one for one in ids) or len(set(ids)) < len(ids):
        return "every request needs a custom_id of its own"
    if not all(isinstance(chat, dict) for _, chat in requests):
        return "every request needs its chat request"
    now = time.time()
    finish = provider.batch_finish or (lambda _: provider.batch_delay)
    expire = WINDOW if provider.batch_expire is None else provider.batch_expire
    prefix = "msgbatch_" if protocol == "anthropic" else "batch_"
    lines = [Line(custom_id, chat, now + finish(n)) for n, (custom_id, chat) in enumerate(requests)]
    job = Job(protocol, f"{prefix}{len(provider.batch_jobs) + 1:06d}", now, now + expire, lines, metadata)
    provider.batch_jobs[job.id] = job
    provider.batches_created.append((protocol, job.id, metadata, len(lines)))
    return job


def settle(provider: Provider, job: Job) -> tuple[str, float | None]:
    """How `job` stands now: ("in_progress", None), or how it ended ("completed", "expired" or "cancelled") and
    when. Its lines finished by then are answered."""
    now = time.time()
    ends = [(max(line.at for line in job.lines), "completed"), (job.expires, "expired")]
    if job.cancelled is not None:
        ends.append((job.cancelled, "cancelled"))
    at, how = min(ends, key=lambda end: end[0])  # all lines finished at expiry: completed
    for line in job.lines:
        if line.status is None and line.at <= min(at, now):
            answer(provider, job, line)
    return (how, at) if at <= now else ("in_progress", None)


def answer(provider: Provider, job: Job, line: Line) -> None:
    """Answer a finished line as the sync routes would, billed as a batch line's; or fail it."""
    messages = line.body.get("messages") or []
    model = str(line.body.get("model"))
    last = str(messages[-1]["content"]) if messages else ""
    if model not in provider.models:
        line.status, line.payload = 404, error(job.protocol, "not_found_error", f"model {model} does not exist")
    elif provider.batch_errors is not None and (failure := provider.batch_errors(last)) is not None:
        line.status, line.payload = 400, error(job.protocol, "invalid_request_error", failure)
    else:
        line.payload, tokens_in, tokens_out = reply(provider, job.protocol, model, line.body)
        line.status = 200
        provider.batch_input_tokens += tokens_in
        provider.batch_output_tokens += tokens_out
    provider.batch_answered.append((job.protocol, job.id, line.custom_id, line.status))


def view(provider: Provider, job: Job) -> dict[str, Any]:
    return openai_batch(provider, job) if job.protocol == "openai" else anthropic_batch(provider, job)


def cancel(provider: Provider, job: Job) -> tuple[int, Content]:
    """Cancel a batch still in progress: its finished lines are kept, the others are not answered."""
    if settle(provider, job)[1] is not None:
        return 400, error(job.protocol, "invalid_request_error", f"batch {job.id} has ended: it cannot be cancelled")
    if job.cancelled is None:
        job.cancelled = time.time()
        provider.batch_cancels.append(job.id)
    if job.protocol == "openai":
        return 200, openai_batch(provider, job, "cancelling")
    return 200, anthropic_batch(provider, job, "canceling")


def listing(provider: Provider, protocol: str, query: dict[str, str]) -> dict[str, Any]:
    """A page of the protocol's batches, newest first, after the `after` (OpenAI) or `after_id` (Anthropic) one."""
    jobs = [job for job in reversed(provider.batch_jobs.values()) if job.protocol == protocol]
    after = query.get("after" if protocol == "openai" else "after_id")
    ids = [job.id for job in jobs]
    if after in ids:
        jobs = jobs[ids.index(after) + 1 :]
    limit = int(query.get("limit") or 20)
    data = [view(provider, job) for job in jobs[:limit]]
    page = {"data": data, "has_more": len(jobs) > limit, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}  # fmt: skip
    return page | {"object": "list"} if protocol == "openai" else page


def shuffled(job: Job) -> list[tuple[int, Line]]:
    """The lines with their positions, in the order results are given: not the batch's."""
    return random.Random(job.id).sample(list(enumerate(job.lines)), len(job.lines))


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def openai_batch(provider: Provider, job: Job, stage: str | None = None) -> dict[str, Any]:
    """The Batch object: as read now, or at a `stage` its request is answered with (validating, cancelling)."""
    how, ended = settle(provider, job) if stage is None else (stage, None)
    if ended is not None and not job.written:
        write_files(provider, job, how)
    completed = sum(line.status == 200 for line in job.lines)
    failed = sum(line.status != 200 and (line.status is not None or how == "expired") for line in job.lines)
    usage = [line.payload["usage"] for line in job.lines if line.status == 200 and line.payload]
    tokens_in, tokens_out = sum(u["prompt_tokens"] for u in usage), sum(u["completion_tokens"] for u in usage)
    completed_at = unix(ended) if how == "completed" else None
    return {
        "id": job.id, "object": "batch", "endpoint": ENDPOINT, "model": job.lines[0].body.get("model"),
        "errors": None, "input_file_id": job.input_file_id, "completion_window": "24h", "status": how,
        "output_file_id": job.output_file_id, "error_file_id": job.error_file_id, "created_at": int(job.created),
        "in_progress_at": None if how == "validating" else int(job.created), "expires_at": int(job.expires),
        "finalizing_at": completed_at, "completed_at": completed_at, "failed_at": None,
        "expired_at": unix(ended) if how == "expired" else None, "cancelling_at": unix(job.cancelled),
        "cancelled_at": unix(ended) if how == "cancelled" else None,
        "request_counts": {"total": len(job.lines), "completed": completed, "failed": failed},
        "metadata": job.metadata,
        "usage": {"input_tokens": tokens_in, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": tokens_out, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": tokens_in + tokens_out},
    }  # fmt: skip


def write_files(provider: Provider, job: Job, how: str) -> None:
    """An ended OpenAI batch's output file (the lines answered 200) and error file (those that failed, and at
    expiry those unfinished, `batch_expired`); lines a cancel left unanswered are in neither."""
    output: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for n, line in shuffled(job):
        if line.status is None and how != "expired":
            continue  # cancelled before it finished
        row: dict[str, Any] = {"id": f"batch_req_{job.id}_{n}", "custom_id": line.custom_id, "response": None,
                               "error": None}  # fmt: skip
        if line.status is None:
            row["error"] = {"code": "batch_expired", "message": EXPIRED}
        else:
            row["response"] = {"status_code": line.status, "request_id": f"req_{job.id}_{n}", "body": line.payload}
        (output if line.status == 200 else errors).append(row)
    if output:
        job.output_file_id = add_file(provider, f"{job.id}_output.jsonl", "batch_output", jsonl(output)).info["id"]
    if errors:
        job.error_file_id = add_file(provider, f"{job.id}_error.jsonl", "batch_output", jsonl(errors)).info["id"]
    job.written = True


def outcome(line: Line, how: str) -> str:
    """An Anthropic result's type for a line of an ended batch."""
    if line.status is not None:
        return "succeeded" if line.status == 200 else "errored"
    return "expired" if how == "expired" else "canceled"


def unix(at: float | None) -> int | None:
    return None if at is None else int(at)


def rfc3339(at: float | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")


def anthropic_batch(provider: Provider, job: Job, stage: str | None = None) -> dict[str, Any]:
    """The MessageBatch: as read now, or at a `stage` its request is answered with (in_progress, canceling). Its
    counts but `processing` stay 0 until it ends, as the API's do."""
    how, ended = settle(provider, job) if stage is None else (stage, None)
    counts = dict.fromkeys(("processing", "succeeded", "errored", "canceled", "expired"), 0)
    for line in job.lines:
        counts["processing" if ended is None else outcome(line, how)] += 1
    return {
        "id": job.id, "type": "message_batch", "request_counts": counts,
        "processing_status": "ended" if ended is not None else how,
        "ended_at": rfc3339(ended), "created_at": rfc3339(job.created), "expires_at": rfc3339(job.expires),
        "archived_at": None, "cancel_initiated_at": rfc3339(job.cancelled),
        "results_url": None if ended is None else f"{provider.url}/v1/messages/batches/{job.id}/results",
    }  # fmt: skip


def results(provider: Provider, job: Job) -> tuple[int, Content]:
    """An ended Anthropic batch's results: one line per request, shuffled."""
    how, ended = settle(provider, job)
    if ended is None:
        return 400, error("anthropic", "invalid_request_error", f"batch {job.id} is still in progress")
    rows = []
    for _, line in shuffled(job):
        kind = outcome(line, how)
        result: dict[str, Any] = {"type": kind}
        if kind == "succeeded":
            result["message"] = line.payload
        elif kind == "errored":
            result["error"] = line.payload
        rows.append({"custom_id": line.custom_id, "result": result})
    return 200, jsonl(rows)
