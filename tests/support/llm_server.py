"""A loopback model provider speaking the OpenAI chat-completions and Anthropic messages protocols, for the `llm`
node's tests: the official `openai` and `anthropic` clients talk to it over HTTP exactly as to a provider.

It checks the key (401), knows a set of models (404 for another), answers 429 with Retry-After to the first
`throttle` calls, can take `delay` seconds per answer (and hold the answers to `held` prompts until `release` is
set), and bills tokens as words (input: every message's words,
the system prompt's too; output: the answer's). `requests` records every request: (protocol, model, status).
The answer to a chat is `echo: <its last message>`.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.http_server import running

KEY = "sk-loopback-test"


@dataclass
class Provider:
    """What the server does and saw."""

    models: set[str] = field(default_factory=lambda: {"gpt-test", "claude-test"})
    key: str = KEY
    throttle: int = 0  # the first N calls get 429
    retry_after: float = 0.05
    delay: float = 0.0
    held: set[str] = field(default_factory=set)  # chats whose last message is one of these wait for `release`
    release: threading.Event = field(default_factory=threading.Event)
    requests: list[tuple[str, str, int]] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""

    def billed(self) -> list[tuple[str, str, int]]:
        """The requests answered 200: what a provider bills."""
        with self.lock:
            return [r for r in self.requests if r[2] == 200]

    def tokens(self) -> tuple[int, int]:
        """(input, output) tokens billed in all."""
        with self.lock:
            return self.input_tokens, self.output_tokens


def _words(text: Any) -> int:
    return len(text.split()) if isinstance(text, str) else 0


def handler(provider: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as providers serve

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            bearer = self.headers.get("Authorization") == f"Bearer {provider.key}"
            if self.path.endswith("/chat/completions"):
                self.answer("openai", body, bearer)
            elif self.path.endswith("/messages"):  # Anthropic's clients send x-api-key, or a bearer token
                self.answer("anthropic", body, bearer or self.headers.get("x-api-key") == provider.key)
            else:
                self.send_json(404, {"error": {"message": f"no route {self.path}"}})

        def answer(self, protocol: str, body: dict[str, Any], authorized: bool) -> None:
            model = str(body.get("model"))
            with provider.lock:
                throttled = provider.throttle > 0
                provider.throttle -= throttled
            if not authorized:
                status, payload = 401, error(protocol, "authentication_error", "invalid api key")
            elif model not in provider.models:
                status, payload = 404, error(protocol, "not_found_error", f"model {model} does not exist")
            elif throttled:
                status, payload = 429, error(protocol, "rate_limit_error", "rate limited: slow down")
            else:
                status, payload = 200, self.chat(protocol, model, body)
            with provider.lock:
                provider.requests.append((protocol, model, status))
            headers = {"retry-after": str(provider.retry_after)} if status == 429 else {}
            self.send_json(status, payload, headers)

        def chat(self, protocol: str, model: str, body: dict[str, Any]) -> dict[str, Any]:
            if provider.delay:
                time.sleep(provider.delay)  # the model's answer time
            messages = body.get("messages") or []
            if messages and messages[-1].get("content") in provider.held:
                provider.release.wait(60)
            text = "echo: " + str(messages[-1]["content"] if messages else "")
            system = body.get("system") if protocol == "anthropic" else None
            tokens_in = sum(_words(m.get("content")) for m in messages) + _words(system)
            tokens_out = _words(text)
            with provider.lock:
                provider.input_tokens += tokens_in
                provider.output_tokens += tokens_out
            if protocol == "openai":
                return {
                    "id": "chatcmpl-loopback", "object": "chat.completion", "created": int(time.time()), "model": model,
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                    "usage": {"prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                              "total_tokens": tokens_in + tokens_out},
                }  # fmt: skip
            return {
                "id": "msg_loopback", "type": "message", "role": "assistant", "model": model,
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out},
            }  # fmt: skip

        def send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


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
