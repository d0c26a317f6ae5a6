"""A loopback model provider speaking the OpenAI chat-completions and Anthropic messages protocols, for the `llm`
node's tests: the official `openai` and `anthropic` clients talk to it over HTTP exactly as to a provider.

It checks the key (401), knows a set of models (404 for another), answers 429 with Retry-After to the first
`throttle` calls (and to the first `throttle_again` calls going on with a chat), can take `delay` seconds per answer
(and hold the answers to `held` prompts until `release` is set), and bills tokens as words (input: every message's
words, the system prompt's too; output: the answer's). `requests` records every request: (protocol, model, status).
The answer to a chat is `echo: <its last message>`; `bodies` keeps every request's body as received.

A request asking for JSON of a schema, the way each API takes it (OpenAI: `response_format` `json_schema`; Anthropic:
a tool whose `input_schema` is the schema, forced by `tool_choice`), is answered as the API does: the JSON text in
`message.content` (OpenAI), a `tool_use` content block whose `input` is the object (Anthropic). The object is
valid for the schema (worker/llm/fake.py `data`, from the chat's first message: its string fields carry it), except
for the first `invalid(first message)` answers of a chat (counted by the assistant turns already in it): their
first typed property has a value of another type — or, with `prose` (OpenAI only), they are not JSON at all.

For the LLM bench (bench/llm.py): `answer_words(last message)` sets how many words a chat's answer has (the echo
padded), so output lengths vary per prompt and no client knows them before the answer; `tokens_per_minute` is a
quota over a sliding minute of billed tokens: a request whose tokens (input and output) would take the last 60 s
past it is answered 429 with Retry-After, the seconds until enough of that minute's tokens have aged out.

On the same port, both providers' batch APIs (OpenAI files and batches, Anthropic message batches): see
tests/support/llm_batches.py, whose lines are answered by this module's `reply` and billed apart.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.http_server import running
from worker.llm import fake

if TYPE_CHECKING:
    from tests.support import llm_batches

KEY = "sk-loopback-test"
#: The batch APIs' paths (tests/support/llm_batches.py): OpenAI's files and batches, Anthropic's message batches.
BATCH_PATHS = ("/v1/files", "/v1/batches", "/v1/messages/batches")


@dataclass
class Provider:
    """What the server does and saw."""

    models: set[str] = field(default_factory=lambda: {"gpt-test", "claude-test"})
    key: str = KEY
    throttle: int = 0  # the first N calls get 429
    throttle_again: int = 0  # the first N calls going on with a chat (an assistant turn in it) get 429
    retry_after: float = 0.05
    delay: float = 0.0
    held: set[str] = field(default_factory=set)  # chats whose last message is one of these wait for `release`
    release: threading.Event = field(default_factory=threading.Event)
    invalid: Callable[[str], int] | None = None  # invalid answers a chat starting with this message gets first
    prose: bool = False  # OpenAI: those invalid answers are prose, not JSON
    requests: list[tuple[str, str, int]] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    answer_words: Callable[[str], int] | None = None  # the answer's length in words, by the chat's last message
    tokens_per_minute: int = 0  # a quota over a sliding minute (0: none)
    billed_at: deque[tuple[float, int]] = field(default_factory=deque)  # (monotonic time, tokens) within the minute
    input_tokens: int = 0
    output_tokens: int = 0
    # The batch APIs (tests/support/llm_batches.py); the knobs above apply to the sync routes only.
    batch_delay: float = 0.0  # seconds after a batch's creation at which its lines finish
    batch_finish: Callable[[int], float] | None = None  # the same by a line's position in its batch (else the above)
    batch_expire: float | None = None  # seconds after creation at which a batch still unfinished expires (None: 24 h)
    batch_errors: Callable[[str], str | None] | None = None  # a line's error message, by its last message (None: ok)
    # (protocol, id, metadata, lines) of every batch created
    batches_created: list[tuple[str, str, dict[str, str] | None, int]] = field(default_factory=list)
    batch_cancels: list[str] = field(default_factory=list)  # the batches cancelled, by id
    answer_creates: threading.Event | None = None  # set: a batch create is answered only once it is set (or never)
    # (protocol, batch id, custom_id, status: 200 or its error's) of every batch line answered, once each
    batch_answered: list[tuple[str, str, str, int]] = field(default_factory=list)
    batch_input_tokens: int = 0  # billed for batch lines, apart from the sync routes' tokens
    batch_output_tokens: int = 0
    batch_files: dict[str, llm_batches.File] = field(default_factory=dict)  # OpenAI files, by id
    batch_jobs: dict[str, llm_batches.Job] = field(default_factory=dict)  # batches of both protocols, oldest first
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def billed(self) -> list[tuple[str, str, int]]:
        """The requests answered 200: what a provider bills."""
        with self.lock:
            return [r for r in self.requests if r[2] == 200]

    def over_quota(self, tokens: int) -> float | None:
        """Seconds until `tokens` more fit the quota's sliding minute, or None when they fit now (then they are
        counted in it). Call with `lock` held."""
        if not self.tokens_per_minute:
            return None
        now = time.monotonic()
        while self.billed_at and self.billed_at[0][0] <= now - 60.0:
            self.billed_at.popleft()
        total = sum(spent for _, spent in self.billed_at)
        if total + tokens <= self.tokens_per_minute or not self.billed_at:  # one request above the quota: alone
            self.billed_at.append((now, tokens))
            return None
        excess, wait = total + tokens - self.tokens_per_minute, 0.0
        for at, spent in self.billed_at:  # the oldest tokens age out first
            excess, wait = excess - spent, at + 60.0 - now
            if excess <= 0:
                break
        return max(wait, 0.001)

    def tokens(self) -> tuple[int, int]:
        """(input, output) tokens billed in all by the sync routes."""
        with self.lock:
            return self.input_tokens, self.output_tokens

    def batch_tokens(self) -> tuple[int, int]:
        """(input, output) tokens billed in all for batch lines."""
        with self.lock:
            return self.batch_input_tokens, self.batch_output_tokens


def _words(text: Any) -> int:
    return len(text.split()) if isinstance(text, str) else 0


def handler(provider: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as providers serve
        disable_nagle_algorithm = True  # a split write must not wait 40 ms for an ACK

        def do_GET(self) -> None:
            self.batches(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.startswith(BATCH_PATHS):
                self.batches(raw)
                return
            body = json.loads(raw or b"{}")
            with provider.lock:
                provider.bodies.append(body)
            if self.path.endswith("/chat/completions"):
                self.answer("openai", body, authorized(provider, "openai", self.headers))
            elif self.path.endswith("/messages"):
                self.answer("anthropic", body, authorized(provider, "anthropic", self.headers))
            else:
                self.send_json(404, {"error": {"message": f"no route {self.path}"}})

        def batches(self, raw: bytes) -> None:
            """Answer a batch API's request: a JSON payload, or a file's bytes."""
            from tests.support import llm_batches  # it imports this module: loaded once this one is whole

            status, content = llm_batches.route(provider, self.command, self.path, self.headers, raw)
            if isinstance(content, bytes):
                self.send_content(status, content, "application/octet-stream")
            else:
                self.send_json(status, content)

        def answer(self, protocol: str, body: dict[str, Any], authorized: bool) -> None:
            model = str(body.get("model"))
            again = any(m.get("role") == "assistant" for m in body.get("messages") or [])
            with provider.lock:
                throttled = provider.throttle > 0 or (again and provider.throttle_again > 0)
                if provider.throttle > 0:
                    provider.throttle -= 1
                elif throttled:
                    provider.throttle_again -= 1
            wait = 0.0  # seconds a 429 over the quota asks to wait (else `retry_after`)
            if not authorized:
                status, payload = 401, error(protocol, "authentication_error", "invalid api key")
            elif model not in provider.models:
                status, payload = 404, error(protocol, "not_found_error", f"model {model} does not exist")
            elif throttled:
                status, payload = 429, error(protocol, "rate_limit_error", "rate limited: slow down")
            else:
                status, payload, wait = self.chat(protocol, model, body)
            with provider.lock:
                provider.requests.append((protocol, model, status))
            headers = {"retry-after": f"{wait or provider.retry_after:g}"} if status == 429 else {}
            self.send_json(status, payload, headers)

        def chat(self, protocol: str, model: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], float]:
            """(status, payload, seconds to ask again after a 429 over the quota, else 0)."""
            messages = body.get("messages") or []
            payload, tokens_in, tokens_out = reply(provider, protocol, model, body)
            with provider.lock:
                wait = provider.over_quota(tokens_in + tokens_out)
            if wait is not None:
                over = error(protocol, "rate_limit_error", "tokens per minute exceeded")
                return 429, over, math.ceil(wait * 1000) / 1000
            if provider.delay:
                time.sleep(provider.delay)  # the model's answer time
            if messages and messages[-1].get("content") in provider.held:
                provider.release.wait(60)
            with provider.lock:
                provider.input_tokens += tokens_in
                provider.output_tokens += tokens_out
            return 200, payload, 0.0

        def send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            self.send_content(status, json.dumps(payload).encode(), "application/json", headers)

        def send_content(
            self, status: int, data: bytes, content_type: str, headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def authorized(provider: Provider, protocol: str, headers: Message) -> bool:
    """The request carries the key: a bearer token, or (Anthropic's clients send it) x-api-key."""
    bearer = headers.get("Authorization") == f"Bearer {provider.key}"
    return bearer or (protocol == "anthropic" and headers.get("x-api-key") == provider.key)


def reply(provider: Provider, protocol: str, model: str, body: dict[str, Any]) -> tuple[dict[str, Any], int, int]:
    """The answer to a chat request, unbilled: (the API's payload, input tokens, output tokens). The sync routes and
    the batch lines (tests/support/llm_batches.py) both answer with it."""
    messages = body.get("messages") or []
    schema, tool = requested_schema(protocol, body)
    value = None if schema is None else structured(provider, schema, messages)
    if schema is None or isinstance(value, str):
        text = value or "echo: " + str(messages[-1]["content"] if messages else "")
        if provider.answer_words is not None and schema is None:
            words = provider.answer_words(str(messages[-1]["content"] if messages else ""))
            text = " ".join([text, *["lorem"] * (words - _words(text))])
    else:
        text = json.dumps(value)
    system = body.get("system") if protocol == "anthropic" else None
    tokens_in = sum(_words(m.get("content")) for m in messages) + _words(system)
    tokens_out = _words(text)
    if protocol == "openai":
        return {
            "id": "chatcmpl-loopback", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                      "total_tokens": tokens_in + tokens_out},
        }, tokens_in, tokens_out  # fmt: skip
    return {
        "id": "msg_loopback", "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out},
    } | ({} if tool is None else {
        "content": [{"type": "tool_use", "id": "toolu_loopback", "name": tool, "input": value}],
        "stop_reason": "tool_use",
    }), tokens_in, tokens_out  # fmt: skip


def requested_schema(protocol: str, body: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(the schema the request asks the answer to match, the Anthropic tool to call with it), or (None, None)."""
    if protocol == "openai":
        shape = body.get("response_format") or {}
        return (shape["json_schema"]["schema"], None) if shape.get("type") == "json_schema" else (None, None)
    choice = body.get("tool_choice") or {}
    tools = {tool["name"]: tool for tool in body.get("tools") or []}
    if choice.get("type") == "tool" and choice.get("name") in tools:
        return tools[choice["name"]]["input_schema"], choice["name"]
    return None, None


def structured(provider: Provider, schema: dict[str, Any], messages: list[dict[str, Any]]) -> Any:
    """The answer's object (or, for an invalid answer with `prose`, its text)."""
    first = str(messages[0]["content"]) if messages else ""
    value = fake.data(schema, first)
    owed = provider.invalid(first) if provider.invalid is not None else 0
    if sum(m.get("role") == "assistant" for m in messages) >= owed:
        return value
    if provider.prose:
        return f"Sure! The answer to {first!r} is below."
    name, part = next((n, p) for n, p in schema["properties"].items() if "type" in p or "enum" in p)
    return {**value, name: "not an array" if part.get("type") == "array" else ["not", "valid"]}


def error(protocol: str, kind: str, message: str) -> dict[str, Any]:
    if protocol == "anthropic":
        return {"type": "error", "error": {"type": kind, "message": message}}
    return {"error": {"message": message, "type": kind, "code": kind}}


@contextlib.contextmanager
def serving(provider: Provider | None = None) -> Iterator[Provider]:
    """Serve `provider` (a default one) on a loopback port until the block ends; its `url` is set."""
    provider = provider or Provider()
    with running(handler(provider)) as server:
        provider.url = server.url
        yield provider


def environment(provider: Provider, key: str = KEY) -> dict[str, str]:
    """The providers' own variables pointing both clients at `provider`."""
    return {
        "OPENAI_API_KEY": key,
        "OPENAI_BASE_URL": f"{provider.url}/v1",
        "ANTHROPIC_API_KEY": key,
        "ANTHROPIC_BASE_URL": provider.url,
    }


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[Provider]:
    """A loopback provider, this process's provider variables pointing at it (CHORDFLOW_LLM_MODEL unset)."""
    monkeypatch.delenv("CHORDFLOW_LLM_MODEL", raising=False)
    with serving() as served:
        for name, value in environment(served).items():
            monkeypatch.setenv(name, value)
        yield served
